//! `RoutingLayer` → `Routing<S>`: refuses malformed paths (400), finds the request's route (404
//! when none), refuses a body its route cannot take (413), and hands the match to the layers
//! below as a request extension.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{self, BoxFuture, FutureExt as _};
use http::{Request, Response};
use tower::{Layer, Service};

use crate::error::{GatewayError, Origin};
use crate::metrics::Metrics;
use crate::proxy::{ProxyBody, RequestBody};
use crate::reload::RouteSource;
use crate::route::check_path;

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
        let refuse = |error: GatewayError| {
            metrics
                .requests
                .with_label_values(&[NO_ROUTE, "refused"])
                .inc();
            future::ready(Err(error)).boxed()
        };
        // New requests match the table in force; the match keeps its route alive to the end.
        let found = check_path(path).and_then(|()| self.routes.current().find(path));
        let routed = match found {
            Ok(Some(routed)) => routed,
            Ok(None) => {
                let path = path.to_owned();
                return refuse(GatewayError::NoRoute { path });
            }
            Err(why) => return refuse(GatewayError::InvalidPath(why)),
        };
        let route = &routed.route;
        // Before the fence: a body the route would refuse must not advance the mark.
        if declared_length(&request).is_some_and(|length| length > route.max_body as u64) {
            metrics
                .requests
                .with_label_values(&[&route.name, "refused"])
                .inc();
            return future::ready(Err(GatewayError::BodyTooLarge {
                route: route.name.clone(),
                limit: route.max_body,
            }))
            .boxed();
        }
        // A chunked (or lying) body is cut off where it passes the limit; the proxy answers 413.
        request.body_mut().limit_to(route.max_body as u64);
        let route = route.name.clone();
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
}

/// The request's `Content-Length`, when it has one (hyper has already refused malformed or
/// conflicting values).
fn declared_length<B>(request: &Request<B>) -> Option<u64> {
    request
        .headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
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
