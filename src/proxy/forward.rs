//! The innermost service: rewrites a routed request for its upstream, sends it on a pooled
//! keep-alive connection within the route's timeout, and streams the response back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{header, HeaderValue, Request, Response, Version};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

use super::tls_clients::TlsClients;
use super::upstream_slots::{upstream_busy, CappedConnector, UpstreamSlots};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower::Service;

use super::headers::{
    append_forwarded_headers, append_via, strip_hop_by_hop_headers, ClientNode, ForwardedFor,
};
use super::{is_body_limit_exceeded, ProxyBody, RequestBody};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::route::RouteMatch;
use crate::telemetry::AccessNote;

/// Idle keep-alive connections kept per upstream: enough for a busy route on a small machine.
pub const MAX_IDLE_UPSTREAM_CONNECTIONS_PER_HOST: usize = 1024;
/// How long an idle upstream connection is kept before it is closed.
const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting to an upstream may take before the attempt counts as refused (502).
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client connection a request came in on: set by the server on every request, rendered for
/// the forwarding headers once per connection.
#[derive(Debug, Clone)]
pub struct ClientAddr {
    pub addr: SocketAddr,
    /// Whether the connection came in over TLS (`Forwarded: proto=https`).
    pub tls: bool,
    node: Arc<ClientNode>,
}

impl ClientAddr {
    pub fn new(addr: SocketAddr) -> ClientAddr {
        ClientAddr {
            addr,
            tls: false,
            node: Arc::new(ClientNode::new(addr.ip())),
        }
    }

    /// The same client, on a TLS connection.
    pub fn over_tls(mut self) -> ClientAddr {
        self.tls = true;
        self
    }
}

/// The pooled HTTP/1.1 client shared by every route.
pub type UpstreamClient = Client<CappedConnector, RequestBody>;

/// The TCP connector under every upstream client.
pub(super) fn http_connector() -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(UPSTREAM_CONNECT_TIMEOUT));
    connector
}

/// The pool settings of every upstream client, plain or TLS.
pub(super) fn client_builder() -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(UPSTREAM_IDLE_TIMEOUT)
        .pool_max_idle_per_host(MAX_IDLE_UPSTREAM_CONNECTIONS_PER_HOST);
    builder
}

/// Builds the shared upstream client; it opens connections only with a slot from `slots`.
pub fn upstream_client(slots: Arc<UpstreamSlots>) -> UpstreamClient {
    client_builder().build(CappedConnector::new(http_connector(), slots))
}

/// Forwards routed requests.
#[derive(Clone)]
pub struct Proxy {
    client: UpstreamClient,
    tls_clients: Arc<TlsClients>,
    slots: Arc<UpstreamSlots>,
    metrics: Arc<Metrics>,
    slot_wait: Duration,
}

impl Proxy {
    pub fn new(metrics: Arc<Metrics>, slots: Arc<UpstreamSlots>) -> Proxy {
        Proxy {
            slot_wait: slots.wait(),
            client: upstream_client(Arc::clone(&slots)),
            tls_clients: Arc::new(TlsClients::default()),
            slots,
            metrics,
        }
    }
}

impl Service<Request<RequestBody>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = GatewayError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let client = self.client.clone();
        let tls_clients = Arc::clone(&self.tls_clients);
        let slots = Arc::clone(&self.slots);
        let metrics = Arc::clone(&self.metrics);
        let slot_wait = self.slot_wait;
        Box::pin(async move {
            let routed =
                request
                    .extensions()
                    .get::<RouteMatch>()
                    .cloned()
                    .ok_or(GatewayError::Internal(
                        "request reached the proxy without a route",
                    ))?;
            let route = routed.route;
            let note = request.extensions().get::<AccessNote>().cloned();
            let upstream_request = upstream_request_filter(request, &route)?;
            let pending = match &route.upstream_tls {
                None => client.request(upstream_request),
                Some(tls) => tls_clients
                    .client_for(tls, &slots)
                    .request(upstream_request),
            };
            let started = std::time::Instant::now();
            let answered = tokio::time::timeout(route.timeout, pending).await;
            let took = started.elapsed();
            metrics
                .upstream_duration
                .with_label_values(&[&route.name])
                .observe(took.as_secs_f64());
            if let Some(note) = &note {
                note.upstream_time(took);
            }
            let response = match answered {
                Err(_elapsed) => {
                    // Dropping the pending request (done by the timeout) makes its connection's
                    // task tear the connection down; it is never reused. That task runs on this
                    // serving thread: yield once so it closes the socket before this error lets
                    // the key's gate open (I4: a timed-out call keeps the key closed until then).
                    tokio::task::yield_now().await;
                    return Err(GatewayError::UpstreamTimeout {
                        after: route.timeout,
                    });
                }
                // The client's chunked body grew past `max_body`: the forward was aborted.
                Ok(Err(source)) if is_body_limit_exceeded(&source) => {
                    return Err(GatewayError::BodyTooLarge {
                        limit: route.max_body,
                    })
                }
                // The client's body was malformed, cut off or stalled: its fault, not the upstream's.
                Ok(Err(source)) if crate::proxy::client_body_fault(&source).is_some() => {
                    return Err(crate::proxy::client_body_fault(&source)
                        .unwrap_or(GatewayError::ClientBody))
                }
                Ok(Err(source)) if upstream_busy(&source) => {
                    return Err(GatewayError::UpstreamBusy { after: slot_wait })
                }
                Ok(Err(source)) => {
                    if let Some(rejection) = crate::tls::certificate_rejection(&source) {
                        return Err(GatewayError::UpstreamTls {
                            upstream: route.upstream.slot_name(),
                            reason: rejection.reason(),
                        });
                    }
                    return Err(GatewayError::UpstreamUnavailable {
                        connect: source.is_connect(),
                        source,
                    });
                }
                Ok(Ok(response)) => response,
            };
            Ok(response_filter(response, &route))
        })
    }
}

/// Rewrites the client's request for the upstream: absolute URI below the base path, `Host` for
/// the upstream, `Via` and `Forwarded` for this hop. `X-Fence` stays.
fn upstream_request_filter(
    request: Request<RequestBody>,
    route: &crate::route::CompiledRoute,
) -> Result<Request<RequestBody>, GatewayError> {
    let (mut parts, body) = request.into_parts();
    let client_host: Option<HeaderValue> = parts.headers.get(header::HOST).cloned().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    parts.uri = route
        .upstream
        .uri_for(parts.uri.path_and_query().map_or("/", |pq| pq.as_str()))
        .map_err(|_| GatewayError::Internal("could not build the upstream URI"))?;
    // Hop-by-hop headers were removed once, at ingress (`Gateway::call`), before any layer set
    // headers of its own; nothing since has added one.
    append_via(&mut parts.headers, parts.version);
    if let Some(client) = parts.extensions.get::<ClientAddr>() {
        let hop = ForwardedFor {
            client: &client.node,
            host: client_host.as_ref(),
            proto: if client.tls { "https" } else { "http" },
        };
        append_forwarded_headers(&mut parts.headers, &hop, route.trust_forwarded);
    }
    let host = match client_host {
        Some(host) if route.preserve_host => host,
        _ => route.upstream.host_header().clone(),
    };
    parts.headers.insert(header::HOST, host);
    route.upstream_headers.apply(&mut parts.headers);
    parts.version = Version::HTTP_11;
    Ok(Request::from_parts(parts, body))
}

/// Strips hop-by-hop headers and the route's `strip_response_headers` from the upstream's
/// response, adds `Via`, and streams the body.
fn response_filter(
    response: Response<Incoming>,
    route: &crate::route::CompiledRoute,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop_headers(&mut parts.headers);
    for name in &route.strip_response_headers {
        parts.headers.remove(name);
    }
    append_via(&mut parts.headers, parts.version);
    let body: ProxyBody = body.map_err(Into::into).boxed();
    Response::from_parts(parts, body)
}
