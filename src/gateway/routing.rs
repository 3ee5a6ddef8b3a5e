//! `RoutingLayer` → `Routing<S>`: refuses paths with dot segments, finds the request's route
//! (404 when none), and hands the match to the layers below as a request extension.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{self, BoxFuture, FutureExt as _};
use http::{Request, Response};
use percent_encoding::percent_decode_str;
use tower::{Layer, Service};

use crate::error::{GatewayError, Origin};
use crate::metrics::Metrics;
use crate::proxy::{ProxyBody, RequestBody};
use crate::reload::RouteSource;

#[derive(Clone)]
pub struct RoutingLayer {
    routes: Arc<RouteSource>,
    metrics: Arc<Metrics>,
}

impl RoutingLayer {
    pub fn new(routes: Arc<RouteSource>, metrics: Arc<Metrics>) -> RoutingLayer {
        RoutingLayer { routes, metrics }
    }
}

impl<S> Layer<S> for RoutingLayer {
    type Service = Routing<S>;

    fn layer(&self, inner: S) -> Routing<S> {
        Routing {
            routes: Arc::clone(&self.routes),
            metrics: Arc::clone(&self.metrics),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Routing<S> {
    routes: Arc<RouteSource>,
    metrics: Arc<Metrics>,
    inner: S,
}

impl<S> Service<Request<RequestBody>> for Routing<S>
where
    S: Service<Request<RequestBody>, Response = Response<ProxyBody>, Error = GatewayError>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = GatewayError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<RequestBody>) -> Self::Future {
        let path = request.uri().path();
        let metrics = Arc::clone(&self.metrics);
        if has_dot_segment(path) {
            metrics
                .requests
                .with_label_values(&[NO_ROUTE, "refused"])
                .inc();
            return future::ready(Err(GatewayError::DotSegment)).boxed();
        }
        // New requests match the table in force; the match keeps its route alive to the end.
        match self.routes.current().find(path) {
            Some(routed) => {
                let route = routed.route.name.clone();
                request.extensions_mut().insert(routed);
                let inflight = metrics.inflight.with_label_values(&[&route]);
                inflight.inc();
                let answer = self.inner.call(request);
                async move {
                    let result = answer.await;
                    inflight.dec();
                    metrics
                        .requests
                        .with_label_values(&[&route, outcome_label(&result)])
                        .inc();
                    result
                }
                .boxed()
            }
            None => {
                metrics
                    .requests
                    .with_label_values(&[NO_ROUTE, "refused"])
                    .inc();
                future::ready(Err(GatewayError::NoRoute {
                    path: path.to_owned(),
                }))
                .boxed()
            }
        }
    }
}

/// The `route` label of requests that matched no route.
pub const NO_ROUTE: &str = "_none";

/// The `outcome` label of an answered request.
pub fn outcome_label(result: &Result<Response<ProxyBody>, GatewayError>) -> &'static str {
    match result {
        Ok(response) if response.headers().contains_key("idempotent-replayed") => "replayed",
        Ok(_) => "forwarded",
        Err(e) if e.origin() == Origin::Client => "refused",
        Err(_) => "failed",
    }
}

/// Whether a path has a `.` or `..` segment, encoded or not. Upstreams normalise these away
/// (RFC 3986 §5.2.4), so `/public/../invoices/7` could match an unfenced route here and write to a
/// fenced resource there; such paths are refused instead.
pub fn has_dot_segment(path: &str) -> bool {
    // Most paths have neither a dot nor an escape: no segment can be a dot segment.
    if !path.bytes().any(|b| b == b'.' || b == b'%') {
        return false;
    }
    path.split('/').any(|segment| {
        let decoded = percent_decode_str(segment).collect::<Vec<u8>>();
        decoded == b"." || decoded == b".."
    })
}

#[cfg(test)]
mod tests {
    use super::has_dot_segment;

    #[test]
    fn dot_segments_are_found_encoded_or_not() {
        assert!(has_dot_segment("/a/../b"));
        assert!(has_dot_segment("/a/./b"));
        assert!(has_dot_segment("/a/%2e%2E/b"));
        assert!(has_dot_segment("/a/.."));
        assert!(!has_dot_segment("/a/..b/c"));
        assert!(!has_dot_segment("/a/.well-known"));
    }
}
