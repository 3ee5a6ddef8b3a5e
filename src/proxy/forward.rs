//! The innermost service: rewrites a routed request for its upstream, sends it on a pooled
//! keep-alive connection within the route's timeout, and streams the response back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::connect::HttpConnector;
use tower::Service;

use super::tls_pools::TlsPools;
use super::upstream_dial::Dialer;
use super::upstream_pool::{ForwardError, UpstreamPool};
use super::upstream_slots::{upstream_busy, CappedConnector, UpstreamSlots};

use super::capture::{read_request, ReadFailure};
use super::headers::{
    append_forwarded_headers, append_via, strip_hop_by_hop_headers, ClientNode, ForwardedFor,
};
use crate::body::budget::{MemoryBudget, Reservation};
use crate::body::{is_body_limit_exceeded, ProxyBody, RequestBody};
use crate::error::{GatewayError, RequestError};
use crate::metrics::Metrics;
use crate::route::RouteMatch;
use crate::telemetry::AccessNote;
use crate::upstream_auth::{GrantError, Token, UpstreamAuth};

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

/// The TCP connector under every upstream connection: it opens them only with a slot from
/// `slots`.
fn tcp_connector(slots: Arc<UpstreamSlots>) -> CappedConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(UPSTREAM_CONNECT_TIMEOUT));
    // The TLS dialer hands it `https://` URIs.
    connector.enforce_http(false);
    CappedConnector::new(connector, slots)
}

/// A pool of this thread's upstream connections, opened by `dialer`.
fn upstream_pool(dialer: Dialer) -> UpstreamPool {
    UpstreamPool::new(
        dialer,
        MAX_IDLE_UPSTREAM_CONNECTIONS_PER_HOST,
        UPSTREAM_IDLE_TIMEOUT,
    )
}

/// Forwards routed requests.
#[derive(Clone)]
pub struct Proxy {
    /// Plain-HTTP upstreams.
    pool: Arc<UpstreamPool>,
    /// HTTPS upstreams, a pool per route TLS setting.
    tls_pools: Arc<TlsPools>,
    metrics: Arc<Metrics>,
    slot_wait: Duration,
    /// Bodies read whole (to send again with renewed credentials) are held under it.
    budget: MemoryBudget,
}

impl Proxy {
    pub fn new(metrics: Arc<Metrics>, slots: Arc<UpstreamSlots>, budget: MemoryBudget) -> Proxy {
        let tcp = tcp_connector(Arc::clone(&slots));
        Proxy {
            slot_wait: slots.wait(),
            pool: Arc::new(upstream_pool(Dialer::plain(tcp.clone()))),
            tls_pools: Arc::new(TlsPools::new(tcp, upstream_pool)),
            metrics,
            budget,
        }
    }
}

impl Service<Request<RequestBody>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = RequestError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let plain_pool = Arc::clone(&self.pool);
        let tls_pools = Arc::clone(&self.tls_pools);
        let metrics = Arc::clone(&self.metrics);
        let slot_wait = self.slot_wait;
        // Only routes that may send a body twice hold it under the budget (no shared count to
        // touch on every other request).
        let budget = request
            .extensions()
            .get::<RouteMatch>()
            .filter(|routed| routed.route.upstream_auth.is_some())
            .map(|_| self.budget.clone());
        Box::pin(async move {
            // The route alone: the match's captures and path stay in the request.
            let route = request
                .extensions()
                .get::<RouteMatch>()
                .map(|routed| Arc::clone(&routed.route))
                .ok_or(GatewayError::Internal(
                    "request reached the proxy without a route",
                ))?;
            let note = request.extensions().get::<AccessNote>().cloned();
            let upstream_request = upstream_request_filter(request, &route)?;
            let pool = match &route.upstream_tls {
                None => plain_pool,
                Some(tls) => tls_pools.pool_for(tls),
            };
            let exchange = Exchange {
                pool: &pool,
                route: &route,
                metrics: &metrics,
                note: note.as_ref(),
                slot_wait,
                budget: budget.as_ref(),
                deadline: tokio::time::Instant::now() + route.timeout,
            };
            let response = match &route.upstream_auth {
                None => exchange.send(upstream_request).await?,
                // Boxed: its state (a body held, token renewals, two sends) would otherwise
                // enlarge every request's future.
                Some(auth) => Box::pin(exchange.send_authorized(auth, upstream_request)).await?,
            };
            Ok(response_filter(response, &route))
        })
    }
}

/// One forwarded request's exchange with its upstream: every attempt it makes ends by the route's
/// timeout, counted from the first.
struct Exchange<'a> {
    pool: &'a Arc<UpstreamPool>,
    route: &'a crate::route::CompiledRoute,
    metrics: &'a Metrics,
    note: Option<&'a AccessNote>,
    slot_wait: Duration,
    /// Set for routes with `[routes.upstream_auth]`.
    budget: Option<&'a MemoryBudget>,
    deadline: tokio::time::Instant,
}

impl Exchange<'_> {
    /// Sends `request` and waits for the response head until the deadline.
    async fn send(
        &self,
        request: Request<RequestBody>,
    ) -> Result<Response<ProxyBody>, GatewayError> {
        let route = self.route;
        let pending = send(self.pool, &route.upstream, request);
        let started = std::time::Instant::now();
        let answered = tokio::time::timeout_at(self.deadline, pending).await;
        let took = started.elapsed();
        self.metrics
            .of_route(route)
            .upstream_duration
            .observe(took.as_secs_f64());
        if let Some(note) = self.note {
            note.upstream(route.upstream.slot(), took);
        }
        match answered {
            Err(_elapsed) => {
                // Dropping the pending request (done by the timeout) closes an HTTP/1.1
                // connection at once; an HTTP/2 stream is reset by its connection's task, which
                // runs on this serving thread: yield once so it has done so before this error
                // lets the key's gate open (I4: a timed-out call keeps the key closed until then).
                tokio::task::yield_now().await;
                Err(GatewayError::UpstreamTimeout {
                    after: route.timeout,
                })
            }
            // The client's chunked body grew past `max_body`: the forward was aborted.
            Ok(Err(Forwarded::Failed { source, .. }))
                if is_body_limit_exceeded(source.as_ref()) =>
            {
                Err(GatewayError::BodyTooLarge {
                    limit: route.max_body,
                })
            }
            // The client's body was malformed, cut off or stalled: its fault, not the upstream's.
            Ok(Err(Forwarded::Failed { source, .. }))
                if crate::proxy::client_body_fault(source.as_ref()).is_some() =>
            {
                Err(crate::proxy::client_body_fault(source.as_ref())
                    .unwrap_or(GatewayError::ClientBody))
            }
            Ok(Err(Forwarded::Failed { source, .. })) if upstream_busy(source.as_ref()) => {
                Err(GatewayError::UpstreamBusy {
                    after: self.slot_wait,
                })
            }
            Ok(Err(Forwarded::Failed { connect, source })) => {
                if let Some(rejection) = crate::tls::certificate_rejection(source.as_ref()) {
                    return Err(GatewayError::UpstreamTls {
                        upstream: route.upstream.slot_name(),
                        reason: rejection.reason(),
                    });
                }
                Err(GatewayError::UpstreamUnavailable { connect, source })
            }
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// Sends `request` with the route's own credentials: the body is read whole first, so that
    /// a request the upstream refuses with 401 can be sent once more with a renewed token. A
    /// second 401, or no token at all, is the gateway's failure: the upstream did nothing.
    async fn send_authorized(
        &self,
        auth: &Arc<UpstreamAuth>,
        request: Request<RequestBody>,
    ) -> Result<Response<ProxyBody>, GatewayError> {
        let (mut parts, body) = request.into_parts();
        // Held (and its bytes reserved) until the answer that needs no resend has come.
        let (body, _held) = self.read_body(body).await?;
        let token = self.token(auth.bearer()).await?;
        parts
            .headers
            .insert(header::AUTHORIZATION, token.authorization().clone());
        let again = parts.clone();
        let first = self
            .send(Request::from_parts(parts, RequestBody::full(body.clone())))
            .await?;
        if first.status() != StatusCode::UNAUTHORIZED {
            return Ok(first);
        }
        drop(first);
        let renewed = self.token(auth.renew_after_refusal(&token)).await?;
        let mut parts = again;
        parts
            .headers
            .insert(header::AUTHORIZATION, renewed.authorization().clone());
        let second = self
            .send(Request::from_parts(parts, RequestBody::full(body)))
            .await?;
        if second.status() == StatusCode::UNAUTHORIZED {
            // Refused twice, the second time a token just obtained: requests back off from the
            // token endpoint for a moment instead of each asking for another.
            auth.refused_again();
            return Err(self.no_credentials(GrantError::RefusedByUpstream));
        }
        Ok(second)
    }

    /// A token from `obtain`, by the deadline.
    async fn token(
        &self,
        obtain: impl std::future::Future<Output = Result<Arc<Token>, GrantError>>,
    ) -> Result<Arc<Token>, GatewayError> {
        match tokio::time::timeout_at(self.deadline, obtain).await {
            Ok(Ok(token)) => Ok(token),
            Ok(Err(error)) => Err(self.no_credentials(error)),
            Err(_elapsed) => Err(self.no_credentials(GrantError::Timeout(self.route.timeout))),
        }
    }

    fn no_credentials(&self, reason: GrantError) -> GatewayError {
        GatewayError::UpstreamCredentials {
            upstream: self.route.upstream.slot_name(),
            reason,
        }
    }

    /// The whole request body (within the route's `max_body`, which the body counts itself),
    /// its bytes reserved in the memory budget.
    async fn read_body(
        &self,
        body: RequestBody,
    ) -> Result<(bytes::Bytes, Reservation), GatewayError> {
        let limit = self.route.max_body;
        let budget = self
            .budget
            .ok_or(GatewayError::Internal("a body read whole without a budget"))?;
        match tokio::time::timeout_at(self.deadline, read_request(body, limit, budget)).await {
            Ok(Ok(Some(read))) => Ok(read),
            Ok(Ok(None)) => Err(GatewayError::BodyTooLarge { limit }),
            Ok(Err(ReadFailure::Body(e))) if is_body_limit_exceeded(e.as_ref()) => {
                Err(GatewayError::BodyTooLarge { limit })
            }
            Ok(Err(ReadFailure::Body(e))) => {
                Err(crate::proxy::client_body_fault(e.as_ref()).unwrap_or(GatewayError::ClientBody))
            }
            Ok(Err(ReadFailure::Busy(busy))) => Err(GatewayError::MemoryBusy { after: busy.wait }),
            Err(_elapsed) => Err(GatewayError::BodyTimeout {
                after: self.route.timeout,
            }),
        }
    }
}

/// Why a forward got no response.
enum Forwarded {
    Failed {
        /// Whether it failed to connect (nothing was sent).
        connect: bool,
        source: crate::body::BoxError,
    },
}

/// Sends `request` (origin form) to `upstream` on `pool`.
async fn send(
    pool: &Arc<UpstreamPool>,
    upstream: &crate::route::UpstreamTarget,
    request: Request<RequestBody>,
) -> Result<Response<ProxyBody>, Forwarded> {
    match pool.send(upstream.slot(), upstream.origin(), request).await {
        Ok(response) => Ok(response.map(|body| body.map_err(Into::into).boxed())),
        Err(ForwardError::Connect(source)) => Err(Forwarded::Failed {
            connect: true,
            source,
        }),
        Err(error @ ForwardError::Exchange(_)) => Err(Forwarded::Failed {
            connect: false,
            source: Box::new(error),
        }),
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
    // The pools send the origin form (made absolute for an HTTP/2 connection).
    parts.uri = route
        .upstream
        .origin_form_for(&parts.uri)
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
    response: Response<ProxyBody>,
    route: &crate::route::CompiledRoute,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop_headers(&mut parts.headers);
    for name in &route.strip_response_headers {
        parts.headers.remove(name);
    }
    append_via(&mut parts.headers, parts.version);
    Response::from_parts(parts, body)
}
