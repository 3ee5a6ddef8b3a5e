//! A body that yields bytes already read from a stream, then the rest of that stream: what is
//! left of a response after the gateway read its start (to record an outcome, or to read ahead).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::body::{BoxError, ProxyBody};

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
        let rest = self.rest.size_hint();
        let Some(first) = &self.first else {
            return rest;
        };
        let extra = first.len() as u64;
        // Upper bound first: raising the lower bound of an exact hint past its upper one panics.
        let mut hint = SizeHint::new();
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(extra));
        }
        hint.set_lower(rest.lower().saturating_add(extra));
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    #[test]
    fn the_hint_of_an_exact_rest_stays_exact_with_the_prefix() {
        let rest = crate::body::full_body(Bytes::from_static(b"world"));
        let body = Prefixed::new(Bytes::from_static(b"hello "), rest);
        assert_eq!(body.size_hint().exact(), Some(11));
    }

    #[tokio::test]
    async fn the_prefix_comes_first() {
        let rest = crate::body::full_body(Bytes::from_static(b"world"));
        let body = Prefixed::new(Bytes::from_static(b"hello "), rest);
        let whole = body.collect().await.expect("collects").to_bytes();
        assert_eq!(&whole[..], b"hello world");
    }
}
