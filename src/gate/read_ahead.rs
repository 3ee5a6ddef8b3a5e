//! Reading a serialized write's response ahead of the client, so that its key's turn ends when
//! the upstream is done rather than when a slow client has read the answer: up to the route's
//! `response_read_ahead` bytes, held under the memory budget. A response that fits is answered
//! from memory and its turn ends at once; a longer one (or one the budget has no room for, or one
//! still arriving when time is up) streams on holding the turn, where the client write timeout
//! bounds a client that stops reading.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tokio::time::Instant;

use crate::body::budget::{MemoryBudget, Reservation};
use crate::body::{BoxError, ProxyBody};
use crate::proxy::Prefixed;

/// A response body after the read-ahead.
pub enum ReadAhead {
    /// All of it, in memory: the upstream is done.
    Whole(ProxyBody),
    /// What was read, then the rest of the stream.
    Partial(ProxyBody),
}

/// Reads `body` ahead, at most `limit` bytes and until `until`.
pub async fn read_ahead(
    mut body: ProxyBody,
    limit: usize,
    budget: &MemoryBudget,
    until: Instant,
) -> Result<ReadAhead, BoxError> {
    let mut reservation = budget.empty();
    let mut read = BytesMut::new();
    loop {
        if body.is_end_stream() {
            return Ok(ReadAhead::Whole(
                Buffered::new(read.freeze(), None, reservation).boxed(),
            ));
        }
        let frame = match tokio::time::timeout_at(until, body.frame()).await {
            Ok(Some(frame)) => frame?,
            Ok(None) => {
                return Ok(ReadAhead::Whole(
                    Buffered::new(read.freeze(), None, reservation).boxed(),
                ))
            }
            // Still arriving when time is up: it streams on.
            Err(_elapsed) => return Ok(partial(read, body, reservation)),
        };
        let frame = match frame.into_data() {
            Ok(data) => {
                let room = read.len() + data.len() <= limit
                    && budget.try_grow(&mut reservation, data.len());
                read.extend_from_slice(&data);
                if !room {
                    return Ok(partial(read, body, reservation));
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(trailers) = frame.into_trailers() {
            return Ok(ReadAhead::Whole(
                Buffered::new(read.freeze(), Some(trailers), reservation).boxed(),
            ));
        }
    }
}

fn partial(read: BytesMut, rest: ProxyBody, reservation: Reservation) -> ReadAhead {
    ReadAhead::Partial(
        crate::body::budget::Budgeted::new(Prefixed::new(read.freeze(), rest), reservation).boxed(),
    )
}

/// A whole response in memory, its bytes held under the budget until it is dropped.
struct Buffered {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    _reservation: Reservation,
}

impl Buffered {
    fn new(data: Bytes, trailers: Option<HeaderMap>, reservation: Reservation) -> Buffered {
        Buffered {
            data: Some(data).filter(|data| !data.is_empty()),
            trailers,
            _reservation: reservation,
        }
    }
}

impl Body for Buffered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
