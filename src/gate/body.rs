//! A response body that holds its key's gate until the upstream's response has been streamed to
//! the end (or the client went away), so the next write of the key starts only after this one.
//! Under a cross-replica turn the body sits in the turn's watch, which drops it if the turn's
//! lease could not be renewed before it would lapse.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::TurnWatch;
use crate::body::{BoxError, ProxyBody};

pub struct GatedBody<P> {
    inner: Inner,
    /// Dropped at the end of the body. A `Mutex` only to make the body `Sync` for boxing.
    pass: Mutex<Option<P>>,
}

enum Inner {
    Owned(ProxyBody),
    /// In the watch of a cross-replica turn.
    Watched(Arc<TurnWatch>),
}

/// The error a cut body ends with.
#[derive(Debug, thiserror::Error)]
#[error("the key's turn could not be renewed in the store; the response was cut before it lapsed")]
struct TurnLapsed;

impl<P> GatedBody<P> {
    pub fn new(inner: ProxyBody, pass: P) -> GatedBody<P> {
        GatedBody {
            inner: Inner::Owned(inner),
            pass: Mutex::new(Some(pass)),
        }
    }

    /// A body handed to a turn's watch.
    pub fn watched(inner: ProxyBody, watch: Arc<TurnWatch>, pass: P) -> GatedBody<P> {
        watch.hold_body(inner);
        GatedBody {
            inner: Inner::Watched(watch),
            pass: Mutex::new(Some(pass)),
        }
    }

    fn release(&self) {
        if let Ok(mut pass) = self.pass.lock() {
            pass.take();
        }
    }
}

impl<P: Send + Unpin + 'static> Body for GatedBody<P> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = match &mut this.inner {
            Inner::Owned(body) => Pin::new(body).poll_frame(cx),
            Inner::Watched(watch) => {
                let mut slot = watch.body();
                match slot.as_mut() {
                    Some(body) => {
                        let polled = Pin::new(body).poll_frame(cx);
                        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
                            slot.take();
                        }
                        polled
                    }
                    None if watch.lapsed() => Poll::Ready(Some(Err(Box::new(TurnLapsed) as _))),
                    None => Poll::Ready(None),
                }
            }
        };
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Owned(body) => body.is_end_stream(),
            Inner::Watched(watch) => match watch.body().as_ref() {
                Some(body) => body.is_end_stream(),
                // A cut body still has its error to tell.
                None => !watch.lapsed(),
            },
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Owned(body) => body.size_hint(),
            Inner::Watched(watch) => watch
                .body()
                .as_ref()
                .map_or_else(|| SizeHint::with_exact(0), Body::size_hint),
        }
    }
}
