//! The body types of the whole gateway: streamed bodies, or small buffers the gateway wrote or
//! read itself (problem details, claim answers, fingerprinted idempotent requests), and
//! (`budget.rs`) the process-wide budget for the bodies it holds in memory. A leaf: it depends on
//! no other module of the crate.

pub mod budget;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt as _, Full};

/// Errors carried by streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response the gateway returns has this body.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// Every request body inside the gateway: the client's stream, or a body the gateway had to read
/// whole (to fingerprint an idempotent request) and now replays. A named type rather than an alias
/// of a boxed trait object, which keeps the layers' `Send` bounds simple for the compiler. It
/// counts the bytes it yields and fails with [`BodyLimitExceeded`] past the route's `max_body`, so
/// a chunked upload cannot grow without bound (no extra allocation: two integers).
pub struct RequestBody {
    inner: BoxBody<Bytes, BoxError>,
    limit: u64,
    read: u64,
}

/// A request body grew past its route's `max_body`; the forward it fed is aborted (413).
#[derive(Debug, thiserror::Error)]
#[error("the request body is larger than {limit} bytes")]
pub struct BodyLimitExceeded {
    pub limit: u64,
}

impl RequestBody {
    /// A body already in memory.
    pub fn full(bytes: Bytes) -> RequestBody {
        RequestBody::unlimited(
            Full::new(bytes)
                .map_err(|never| -> BoxError { match never {} })
                .boxed(),
        )
    }

    pub fn unlimited(inner: BoxBody<Bytes, BoxError>) -> RequestBody {
        RequestBody {
            inner,
            limit: u64::MAX,
            read: 0,
        }
    }

    /// From now on, fail once more than `limit` bytes in all have been yielded.
    pub fn limit_to(&mut self, limit: u64) {
        self.limit = limit;
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.read = this.read.saturating_add(data.len() as u64);
                if this.read > this.limit {
                    let exceeded = BodyLimitExceeded { limit: this.limit };
                    return std::task::Poll::Ready(Some(Err(Box::new(exceeded))));
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `error` (or an error it wraps) is a request body over its limit.
pub fn is_body_limit_exceeded(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<BodyLimitExceeded>() {
            return true;
        }
        current = e.source();
    }
    false
}

/// A complete, in-memory body.
pub fn full_body(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}
