//! `RoutingLayer` → `Routing<S>`: makes the path canonical (400 when it cannot be), finds the
//! request's route (404 when none), puts the canonical path it matched in the request so that
//! is what is forwarded, checks a WebDAV `Destination`, refuses a body its route cannot take
//! (413), and hands the match to the layers below as a request extension.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::future::{self, BoxFuture, FutureExt as _};
use http::{Request, Response};
use tower::{Layer, Service};

use crate::body::{ProxyBody, RequestBody};
use crate::checks::check_destination;
use crate::error::{GatewayError, Origin, RequestError};
use crate::metrics::Metrics;
use crate::proxy::extensions::GatewayReplay;
use crate::reload::RouteSource;
use crate::route::{
    canonicalize, check_method_override, CompiledRoute, PathRefusal, RouteMatch, RouteTable,
    RESERVED_PREFIX, UNFENCED_METHODS,
};
use crate::telemetry::AccessNote;

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
    S: Service<Request<RequestBody>, Response = Response<ProxyBody>, Error = RequestError>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = RequestError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<RequestBody>) -> Self::Future {
        let metrics = Arc::clone(&self.metrics);
        // New requests match the table in force; the match keeps its route alive to the end.
        let table = self.routes.current();
        let routed = match route_request(&mut request, &table) {
            Ok(routed) => routed,
            Err(error) => {
                metrics
                    .requests
                    .with_label_values(&[NO_ROUTE, "refused"])
                    .inc();
                metrics.observe_unrouted(NO_ROUTE, request.method(), error.kind().spec().status);
                return future::ready(Err(error.into())).boxed();
            }
        };
        let route = &routed.route;
        if let Some(note) = request.extensions().get::<AccessNote>() {
            note.route(&route.name, route.trust_forwarded);
        }
        // Before the fence: a body the route would refuse must not advance the mark.
        if declared_length(&request).is_some_and(|length| length > route.max_body as u64) {
            metrics.of_route(route).refused.inc();
            let refusal = GatewayError::BodyTooLarge {
                limit: route.max_body,
            };
            metrics.observe_response(route, request.method(), refusal.kind().spec().status);
            return future::ready(Err(refusal.on_route(route.name.clone()))).boxed();
        }
        // A chunked (or lying) body is cut off where it passes the limit; the proxy answers 413.
        request.body_mut().limit_to(route.max_body as u64);
        let route = Arc::clone(route);
        request.extensions_mut().insert(routed);
        let inflight = InFlight::new(Arc::clone(&route), &metrics);
        let method = request.method().clone();
        let started = Instant::now();
        let answer = self.inner.call(request);
        async move {
            let result = answer.await;
            drop(inflight);
            let series = metrics.of_route(&route);
            series.duration.observe(started.elapsed().as_secs_f64());
            series.outcome(outcome_label(&result)).inc();
            let status = match &result {
                Ok(response) => response.status(),
                Err(error) => error.kind().spec().status,
            };
            metrics.observe_response(&route, &method, status);
            // The route, attached once to whatever failed below.
            result.map_err(|error| error.on_route(route.name.clone()))
        }
        .boxed()
    }
}

/// Counts one request in its route's in-flight gauge until dropped: with the request's future,
/// also when hyper drops it because the client went away.
struct InFlight(Arc<CompiledRoute>);

impl InFlight {
    fn new(route: Arc<CompiledRoute>, metrics: &Metrics) -> InFlight {
        metrics.of_route(&route).inflight.inc();
        InFlight(route)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Set by `new`.
        if let Some(series) = self.0.metrics.get() {
            series.inflight.dec();
        }
    }
}

/// Finds a request's route from its canonical path, puts that path in the request, and checks
/// what depends on the route (a method override, a collection write, a `Destination`).
fn route_request<B>(
    request: &mut Request<B>,
    table: &RouteTable,
) -> Result<RouteMatch, GatewayError> {
    let path = request.uri().path();
    let canonical = canonicalize(path).map_err(GatewayError::InvalidPath)?;
    if is_reserved(canonical.as_str()) {
        // `//_fencegate/claim/..`: the gateway's own space, never an upstream's.
        return Err(GatewayError::InvalidPath(PathRefusal::ReservedPrefix));
    }
    let routed = table
        .find(&canonical, request.method())
        .map_err(GatewayError::InvalidPath)?
        .ok_or_else(|| GatewayError::NoRoute {
            path: path.to_owned(),
        })?;
    forward_canonical(request, &routed)?;
    forward_typed_inputs(request, &routed)?;
    check_guarded_request(request, &routed, table)?;
    if !UNFENCED_METHODS.contains(request.method())
        && request.headers().contains_key(crate::checks::DESTINATION)
    {
        let host = request_host(request);
        if let Some(canonical) = check_destination(request.headers(), host.as_deref(), table)
            .map_err(GatewayError::Destination)?
        {
            request
                .headers_mut()
                .insert(crate::checks::DESTINATION, canonical);
        }
    }
    Ok(routed)
}

/// The checks that depend on the route a request reached: a method override on a guarded route
/// (the upstream may honour it, and the route's method list was decided without it), and a
/// DELETE or MOVE whose path may be a collection holding fenced resources.
fn check_guarded_request<B>(
    request: &Request<B>,
    routed: &RouteMatch,
    table: &RouteTable,
) -> Result<(), GatewayError> {
    if routed.route.is_guarded() {
        check_method_override(request.headers(), request.uri().query())
            .map_err(GatewayError::InvalidMethod)?;
    }
    let method = request.method().as_str();
    if ["DELETE", "MOVE"]
        .iter()
        .any(|m| m.eq_ignore_ascii_case(method))
    {
        let path = canonicalize(&routed.path).map_err(GatewayError::InvalidPath)?;
        let stripped = path.has_parameters().then(|| path.without_parameters());
        for reading in std::iter::once(&path).chain(stripped.as_ref()) {
            if let Some(route) = table.collection_guard(reading) {
                return Err(GatewayError::FencedCollection {
                    fenced_route: route.name.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Puts the typed query parameters and headers the route's keys read in the canonical form they
/// are keyed by (`?id=042` is forwarded as `?id=42`), so the upstream reads the value that was
/// keyed.
fn forward_typed_inputs<B>(
    request: &mut Request<B>,
    routed: &RouteMatch,
) -> Result<(), GatewayError> {
    if !routed.route.typed_inputs {
        return Ok(());
    }
    let query = request.uri().query().map(str::to_owned);
    let Some(query) = routed
        .route
        .canonicalize_inputs(request.headers_mut(), query.as_deref())
    else {
        return Ok(());
    };
    let target = format!("{}?{query}", request.uri().path());
    replace_target(request, &target)
}

/// Whether a canonical path lies under the reserved prefix, in any letter case.
fn is_reserved(canonical: &str) -> bool {
    canonical
        .get(..RESERVED_PREFIX.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(RESERVED_PREFIX))
}

/// Puts the canonical path the route matched in the request's target (the query is kept as
/// sent), so the layers below and the upstream read the path the gateway keyed.
fn forward_canonical<B>(request: &mut Request<B>, routed: &RouteMatch) -> Result<(), GatewayError> {
    let uri = request.uri();
    if uri.path() == routed.path {
        return Ok(());
    }
    let target = match uri.query() {
        Some(query) => format!("{}?{query}", routed.path),
        None => routed.path.clone(),
    };
    replace_target(request, &target)
}

/// Puts `target` (a path and query the gateway made) in place of the request's.
fn replace_target<B>(request: &mut Request<B>, target: &str) -> Result<(), GatewayError> {
    let mut parts = request.uri().clone().into_parts();
    parts.path_and_query = Some(
        target
            .parse()
            .map_err(|_| GatewayError::Internal("a canonical target did not parse"))?,
    );
    *request.uri_mut() = http::Uri::from_parts(parts)
        .map_err(|_| GatewayError::Internal("a canonical target did not make a URI"))?;
    Ok(())
}

/// The host the client addressed: `Host`, or the target's authority (HTTP/2, absolute-form);
/// the gateway has already checked that the two agree.
fn request_host<B>(request: &Request<B>) -> Option<String> {
    request
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()))
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
pub fn outcome_label(result: &Result<Response<ProxyBody>, RequestError>) -> &'static str {
    match result {
        // The gateway's own replays; a provider's (its `Idempotent-Replayed`) was forwarded.
        Ok(response) if response.extensions().get::<GatewayReplay>().is_some() => "replayed",
        Ok(_) => "forwarded",
        Err(e) if e.origin() == Origin::Client => "refused",
        Err(_) => "failed",
    }
}
