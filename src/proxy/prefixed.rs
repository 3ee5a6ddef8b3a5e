//! A body that yields bytes already read from a stream, then the rest of that stream: what is
//! left of a response after the gateway read its start (to record an outcome, or to read ahead).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{BoxError, ProxyBody};

/// A body that yields `first`, then streams `rest`.
pub struct Prefixed {
    first: Option<Bytes>,
    rest: ProxyBody,
}

impl Prefixed {
    pub fn new(first: Bytes, rest: ProxyBody) -> Prefixed {
        Prefixed {
            first: Some(first).filter(|first| !first.is_empty()),
            rest,
        }
    }
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        Pin::new(&mut this.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.rest.size_hint();
        if let Some(first) = &self.first {
            let extra = first.len() as u64;
            hint.set_lower(hint.lower() + extra);
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + extra);
            }
        }
        hint
    }
}
