//! A response body that holds its key's gate until the upstream's response has been streamed to
//! the end (or the client went away), so the next write of the key starts only after this one.

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::proxy::{BoxError, ProxyBody};

pub struct GatedBody<P> {
    inner: ProxyBody,
    /// Dropped at the end of the body. A `Mutex` only to make the body `Sync` for boxing.
    pass: Mutex<Option<P>>,
}

impl<P> GatedBody<P> {
    pub fn new(inner: ProxyBody, pass: P) -> GatedBody<P> {
        GatedBody {
            inner,
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
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.release();
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
