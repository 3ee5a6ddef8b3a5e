//! Reading bodies under the memory budget: a request whole (bounded; to fingerprint it for
//! idempotency, or to send it again with renewed upstream credentials), and a response's first
//! bytes (up to the stored-body cap) so an outcome can be recorded before the client sees it.
//! A body that arrives in one frame (the usual case) is kept as that frame, not copied.

use bytes::{Bytes, BytesMut};
use http_body::Body as _;
use http_body_util::BodyExt as _;

use crate::body::budget::{MemoryBudget, MemoryBusy, Reservation};
use crate::body::{BoxError, ProxyBody, RequestBody};

/// Why a request body could not be read whole.
#[derive(Debug)]
pub enum ReadFailure {
    /// The body itself failed (the client's framing, a pause, the route's `max_body`).
    Body(BoxError),
    /// No room in the buffered-body budget.
    Busy(MemoryBusy),
}

/// Reads `body` whole, its bytes reserved in `budget` as they arrive (all at once when the
/// length is known); `Ok(None)` when it is longer than `limit`.
pub async fn read_request(
    mut body: RequestBody,
    limit: usize,
    budget: &MemoryBudget,
) -> Result<Option<(Bytes, Reservation)>, ReadFailure> {
    let mut reservation = budget.empty();
    let hint = body.size_hint();
    if let Some(exact) = hint.exact() {
        let Ok(exact) = usize::try_from(exact) else {
            return Ok(None);
        };
        if exact > limit {
            return Ok(None);
        }
        budget
            .grow(&mut reservation, exact)
            .await
            .map_err(ReadFailure::Busy)?;
    }
    let mut buffer = Gathered::default();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(ReadFailure::Body)?.into_data() {
            if buffer.len() + data.len() > limit {
                return Ok(None);
            }
            let unreserved = (buffer.len() + data.len()).saturating_sub(reservation.bytes());
            budget
                .grow(&mut reservation, unreserved)
                .await
                .map_err(ReadFailure::Busy)?;
            buffer.push(data);
        }
    }
    Ok(Some((buffer.into_bytes(), reservation)))
}

/// The start of a response body: all of it when it fits in `limit`, else the bytes read so far
/// and the rest of the stream.
pub enum Prefix {
    Whole(Bytes),
    Longer { read: Bytes, rest: ProxyBody },
}

/// Reads the start of `body`, each byte kept reserved in `reservation`; a frame the budget has
/// no room for ends the capture as if the body were longer than `limit` (it is then answered,
/// but not stored).
pub async fn read_prefix(
    mut body: ProxyBody,
    limit: usize,
    budget: &MemoryBudget,
    reservation: &mut Reservation,
) -> Result<Prefix, BoxError> {
    let mut buffer = Gathered::default();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            let room = budget.try_grow(reservation, data.len());
            buffer.push(data);
            if buffer.len() > limit || !room {
                return Ok(Prefix::Longer {
                    read: buffer.into_bytes(),
                    rest: body,
                });
            }
        }
    }
    Ok(Prefix::Whole(buffer.into_bytes()))
}

/// A body's frames so far: the first one as it came, copied into one buffer only once a second
/// one arrives.
#[derive(Default)]
enum Gathered {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Gathered {
    fn len(&self) -> usize {
        match self {
            Gathered::Empty => 0,
            Gathered::One(bytes) => bytes.len(),
            Gathered::Many(buffer) => buffer.len(),
        }
    }

    fn push(&mut self, data: Bytes) {
        *self = match std::mem::take(self) {
            Gathered::Empty => Gathered::One(data),
            Gathered::One(first) => {
                let mut buffer = BytesMut::with_capacity(first.len() + data.len());
                buffer.extend_from_slice(&first);
                buffer.extend_from_slice(&data);
                Gathered::Many(buffer)
            }
            Gathered::Many(mut buffer) => {
                buffer.extend_from_slice(&data);
                Gathered::Many(buffer)
            }
        };
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Gathered::Empty => Bytes::new(),
            Gathered::One(bytes) => bytes,
            Gathered::Many(buffer) => buffer.freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_frame_is_kept_as_it_came_and_more_are_joined_in_order() {
        let frame = Bytes::from_static(b"whole body");
        let mut one = Gathered::default();
        one.push(frame.clone());
        assert_eq!(one.len(), 10);
        let kept = one.into_bytes();
        // The same bytes, not a copy of them.
        assert_eq!(kept.as_ptr(), frame.as_ptr());

        let mut many = Gathered::default();
        for part in [&b"ab"[..], b"", b"cde", b"f"] {
            many.push(Bytes::copy_from_slice(part));
        }
        assert_eq!(many.len(), 6);
        assert_eq!(&many.into_bytes()[..], b"abcdef");
        assert!(Gathered::default().into_bytes().is_empty());
    }
}
