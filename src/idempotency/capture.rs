//! Reading bodies for the idempotency flow: the request whole (bounded, to fingerprint it), and
//! the response's first bytes (up to the stored-body cap) so the outcome can be recorded before
//! the client sees it — a client that retries right after its answer then finds it recorded.

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::proxy::{BoxError, ProxyBody, RequestBody};

/// Reads `body` whole; `Ok(None)` when it is longer than `limit`.
pub async fn read_request(mut body: RequestBody, limit: usize) -> Result<Option<Bytes>, BoxError> {
    let mut buffer = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if buffer.len() + data.len() > limit {
                return Ok(None);
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(Some(buffer.freeze()))
}

/// The start of a response body: all of it when it fits in `limit`, else the bytes read so far
/// and the rest of the stream.
pub enum Prefix {
    Whole(Bytes),
    Longer { read: Bytes, rest: ProxyBody },
}

pub async fn read_prefix(mut body: ProxyBody, limit: usize) -> Result<Prefix, BoxError> {
    let mut buffer = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            buffer.extend_from_slice(&data);
            if buffer.len() > limit {
                return Ok(Prefix::Longer {
                    read: buffer.freeze(),
                    rest: body,
                });
            }
        }
    }
    Ok(Prefix::Whole(buffer.freeze()))
}

/// A body that yields `first`, then streams `rest`.
pub struct Prefixed {
    first: Option<Bytes>,
    rest: ProxyBody,
}

impl Prefixed {
    pub fn new(first: Bytes, rest: ProxyBody) -> Prefixed {
        Prefixed {
            first: Some(first),
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
