//! The body types of the whole gateway: streamed bodies, or small buffers the gateway wrote or
//! read itself (problem details, claim answers, fingerprinted idempotent requests).

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt as _, Full};

/// Errors carried by streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response the gateway returns has this body.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// What every service of the routed stack returns. One boxed type for all of them, so a layer
/// that does not apply to a request hands back its inner service's future as it is, unboxed
/// and unwrapped again.
pub type ProxyFuture = futures_util::future::BoxFuture<
    'static,
    Result<http::Response<ProxyBody>, crate::error::GatewayError>,
>;

/// Every request body inside the gateway: the client's stream, or a body the gateway had to read
/// whole (to fingerprint an idempotent request) and now replays. A named type rather than an alias
/// of a boxed trait object, which keeps the layers' `Send` bounds simple for the compiler.
pub struct RequestBody(BoxBody<Bytes, BoxError>);

impl RequestBody {
    /// The client's body, streamed.
    pub fn streamed(incoming: hyper::body::Incoming) -> RequestBody {
        RequestBody(incoming.map_err(|e| -> BoxError { Box::new(e) }).boxed())
    }

    /// A body already in memory.
    pub fn full(bytes: Bytes) -> RequestBody {
        RequestBody(
            Full::new(bytes)
                .map_err(|never| -> BoxError { match never {} })
                .boxed(),
        )
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

/// A complete, in-memory body.
pub fn full_body(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}
