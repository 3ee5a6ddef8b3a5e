//! The response body type of the whole gateway: either a streamed upstream body or a small
//! buffer the gateway wrote itself (problem details, claim answers).

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt as _, Full};

/// Errors carried by streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response the gateway returns has this body.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A complete, in-memory body.
pub fn full_body(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}
