//! The shape every layer of the routed stack shares: the one boxed future type and the inner
//! service a layer wraps.

use crate::body::{ProxyBody, RequestBody};

/// What every service of the routed stack returns. One boxed type for all of them, so a layer
/// that does not apply to a request hands back its inner service's future as it is, unboxed
/// and unwrapped again.
pub type ProxyFuture = futures_util::future::BoxFuture<
    'static,
    Result<http::Response<ProxyBody>, crate::error::RequestError>,
>;

/// The inner service a layer of the routed stack wraps: the rest of the stack, answering with
/// [`ProxyFuture`] so that a layer that does not apply can return its future as it is.
pub trait StackService:
    tower::Service<
        http::Request<RequestBody>,
        Response = http::Response<ProxyBody>,
        Error = crate::error::RequestError,
        Future = ProxyFuture,
    > + Clone
    + Send
    + 'static
{
}

impl<S> StackService for S where
    S: tower::Service<
            http::Request<RequestBody>,
            Response = http::Response<ProxyBody>,
            Error = crate::error::RequestError,
            Future = ProxyFuture,
        > + Clone
        + Send
        + 'static
{
}
