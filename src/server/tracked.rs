//! The service a connection is served with, wrapped so that its [`ConnectionActivity`] knows
//! which requests are open and which responses wait for the client: a request counts from the
//! moment hyper hands it over until its response body ends or is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body::{Body, Frame, SizeHint};
use tower::Service;

use super::activity::{ConnectionActivity, RequestGuard};

/// `inner`, with its requests counted on `activity`.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    activity: Arc<ConnectionActivity>,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Arc<ConnectionActivity>) -> Tracked<S> {
        Tracked { inner, activity }
    }
}

impl<S, R, B> Service<Request<R>> for Tracked<S>
where
    S: Service<Request<R>, Response = Response<B>>,
{
    type Response = Response<ClientBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<R>) -> Self::Future {
        if request.version() == Version::HTTP_2 {
            self.activity.note_http2();
        }
        let guard = self.activity.open_request();
        TrackedFuture {
            inner: self.inner.call(request),
            guard: Some(guard),
        }
    }
}

pin_project_lite::pin_project! {
    /// The service's future, holding its request's guard until the response is ready.
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        guard: Option<RequestGuard>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ClientBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answered = std::task::ready!(this.inner.poll(cx));
        Poll::Ready(answered.map(|response| match this.guard.take() {
            Some(guard) => response.map(|body| ClientBody::new(body, guard)),
            None => response.map(ClientBody::untracked),
        }))
    }
}

/// A response body on its way to the client. Between handing hyper a frame and being asked for
/// the next one it is waiting for the client (hyper asks again once the frame is written, and on
/// HTTP/2 once the client's flow-control window has room); its slot says since when.
pub struct ClientBody<B> {
    inner: B,
    tracking: Option<Tracking>,
}

struct Tracking {
    slot: Arc<AtomicU64>,
    guard: RequestGuard,
}

impl<B> ClientBody<B> {
    fn new(inner: B, guard: RequestGuard) -> ClientBody<B> {
        let slot = guard.activity().response_slot();
        ClientBody {
            inner,
            tracking: Some(Tracking { slot, guard }),
        }
    }

    fn untracked(inner: B) -> ClientBody<B> {
        ClientBody {
            inner,
            tracking: None,
        }
    }
}

impl<B> Body for ClientBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(tracking) = &this.tracking {
            tracking.slot.store(0, Ordering::Relaxed);
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => {
                if let Some(tracking) = &this.tracking {
                    let now = tracking.guard.activity().stamp();
                    tracking.slot.store(now, Ordering::Relaxed);
                }
            }
            // The end: the request is no longer open.
            Poll::Ready(None | Some(Err(_))) => this.tracking = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
