//! The gateway service: the reserved `/_fencegate/` endpoints, and for everything else the
//! request stack assembled in one place, one layer per line. Failures of any layer become problem
//! responses here and nowhere else.

mod claim;
mod routing;

pub use claim::Claim;
pub use routing::{Routing, RoutingLayer};

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{Request, Response};
use tower::{Service, ServiceBuilder};

use crate::authority::Authorities;
use crate::body::budget::MemoryBudget;
use crate::body::ProxyBody;
use crate::checks::{check_host, transfer_coding_is_plain};
use crate::error::{GatewayError, Origin};
use crate::fence::{Fence, FenceLayer};
use crate::gate::{Gate, GateLayer, Gates};
use crate::guard::CheckedStore;
use crate::idempotency::{Idempotency, IdempotencyLayer, IntentBackend};
use crate::metrics::Metrics;
use crate::proxy::extensions::AmbiguousFraming;
use crate::proxy::{
    streamed_body, strip_hop_by_hop_headers, strip_path_override_headers, ClientAddr, Proxy,
    UpstreamSlots,
};
use crate::reload::RouteSource;
use crate::request_id::{assign_request_id, stamp_request_id};
use crate::route::{check_method_spelling, RESERVED_PREFIX};
use crate::store::intents::NoIntentStore;
use crate::store::IntentStore;
use crate::telemetry::{AccessNote, ReceivedBody, Telemetry};

type RoutedStack = Routing<Fence<Idempotency<Gate<Proxy>>>>;

/// What the gateways of all serving threads share besides routes, store and gates: the budget
/// for buffered bodies, the upstream connection slots, and how long a client's body may pause.
#[derive(Clone)]
pub struct SharedLimits {
    pub budget: MemoryBudget,
    pub upstream_slots: Arc<UpstreamSlots>,
    pub body_timeout: Duration,
}

/// Where the gateway reports what it does: metrics, and each request's access line and span.
#[derive(Clone)]
pub struct Reporting {
    pub metrics: Arc<Metrics>,
    pub telemetry: Telemetry,
}

/// The whole data plane as one cloneable service.
#[derive(Clone)]
pub struct Gateway {
    claim: Claim,
    routed: RoutedStack,
    body_timeout: Duration,
    telemetry: Telemetry,
}

impl Gateway {
    pub fn new(
        routes: Arc<RouteSource>,
        store: Arc<CheckedStore>,
        intents: Option<Arc<dyn IntentStore>>,
        gates: Gates,
        limits: SharedLimits,
        authorities: Option<Arc<Authorities>>,
        Reporting { metrics, telemetry }: Reporting,
    ) -> Gateway {
        // `intents`, when given, are the fence store's own backend. Without them, idempotent
        // routes answer 503.
        let intents = IntentBackend {
            intents: intents.unwrap_or_else(|| Arc::new(NoIntentStore)),
            fences: Arc::clone(&store),
        };
        let routed = ServiceBuilder::new()
            // First: find the route, so every later layer knows the route's settings (among
            // them which layer makes a fenced write's advance, `CompiledRoute::advance_by`).
            .layer(RoutingLayer::new(Arc::clone(&routes), Arc::clone(&metrics)))
            // Before anything can reach the upstream: refuse stale generations (I1, I2), and
            // tokens whose lease the route's lock authority saw end.
            .layer(FenceLayer::new(Arc::clone(&store), authorities))
            // After the fence (a superseded holder is refused before any replay) and before the
            // gate (a duplicate in flight is answered 409 at once instead of queueing).
            .layer(IdempotencyLayer::new(intents, limits.budget.clone()))
            // After admission, before forwarding: one write per key in flight, in admission
            // order, re-checked against newer admissions when its turn comes (I4).
            .layer(GateLayer::new(
                gates.clone(),
                Arc::clone(&store),
                Arc::clone(&metrics),
                limits.budget.clone(),
            ))
            // Last: forward what passed.
            .service(Proxy::new(
                Arc::clone(&metrics),
                limits.upstream_slots,
                limits.budget,
            ));
        Gateway {
            claim: Claim::new(store, routes, gates),
            routed,
            body_timeout: limits.body_timeout,
            telemetry,
        }
    }
}

/// Notes a refusal of the request head in the request's access record, if it has one.
fn note_refusal<B>(request: &Request<B>, refusal: &GatewayError) {
    if let Some(note) = request.extensions().get::<AccessNote>() {
        note.refused(refusal.kind().spec().slug);
    }
}

/// What `Allow` lists when `CONNECT` is refused: every method a route may forward.
const ALLOW_BUT_CONNECT: &str = "GET, HEAD, OPTIONS, TRACE, POST, PUT, PATCH, DELETE";

/// The checks of a request's head that hold whatever its path: framing, method and host. The
/// gateway must read a request as every upstream would, or refuse it.
/// `plain_coding`: whether the request's transfer coding, read before the hop-by-hop headers
/// were removed, is at most one `chunked`.
fn check_request_head<B>(request: &Request<B>, plain_coding: bool) -> Result<(), GatewayError> {
    // A head with both `Content-Length` and `Transfer-Encoding` (hyper kept only the latter) is
    // a smuggling attempt or a broken client; a coding besides `chunked` would reach the upstream
    // still applied, as content.
    if !plain_coding || request.extensions().get::<AmbiguousFraming>().is_some() {
        return Err(GatewayError::AmbiguousFraming);
    }
    // A tunnel would carry writes the gateway never sees.
    if request.method() == http::Method::CONNECT {
        return Err(GatewayError::MethodNotAllowed {
            allow: ALLOW_BUT_CONNECT,
        });
    }
    check_method_spelling(request.method()).map_err(GatewayError::InvalidMethod)?;
    check_host(request).map_err(GatewayError::InvalidHost)
}

/// Any body a server hands the gateway: hyper's, or the gateway's own HTTP/1 server's.
impl<B> Service<Request<B>> for Gateway
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Every layer of the stack is always ready; polling it keeps the tower contract for the
        // direct `call` below. Its errors are answered per request, never here.
        match self.routed.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // Read before the hop-by-hop headers go, `Transfer-Encoding` among them.
        let plain_coding = transfer_coding_is_plain(request.headers());
        // First of all: drop hop-by-hop headers and every header the client names in
        // `Connection`, so a client cannot make the gateway strip, at the proxy, a header a layer
        // set for the upstream (`Connection: Idempotency-Key`, `Connection: X-Request-Id`).
        strip_hop_by_hop_headers(request.headers_mut());
        // Older Symfony, Zend and IIS route by these instead of the request line: the upstream
        // must route by the path the gateway routed.
        strip_path_override_headers(request.headers_mut());
        // Before the reserved/routed split, so both answer with the id and every layer (and the
        // upstream) sees it; not a layer, because the error-to-response step below needs it too.
        let request_id = assign_request_id(&mut request);
        // The access line's record (and the request's span), filled by the layers through the
        // request's extensions and written when the response body ends.
        let peer = request
            .extensions()
            .get::<ClientAddr>()
            .map(|client| client.addr.ip());
        let entry = self
            .telemetry
            .start(&mut request, request_id.as_str(), peer);
        let finish = move |response: Response<ProxyBody>| match entry {
            Some(entry) => entry.finish(response),
            None => response,
        };
        // Refused whatever the path: ambiguous framing, `CONNECT`, a method spelled in another
        // letter case, two hosts.
        if let Err(refusal) = check_request_head(&request, plain_coding) {
            note_refusal(&request, &refusal);
            let response = refusal.into_response(&request_id);
            return Box::pin(std::future::ready(Ok(finish(stamp_request_id(
                response,
                &request_id,
            )))));
        }
        if request.uri().path().starts_with(RESERVED_PREFIX) {
            let claim = self.claim.clone();
            let note = request.extensions().get::<AccessNote>().cloned();
            return Box::pin(async move {
                let response = claim.handle(request).await.unwrap_or_else(|e| {
                    if let Some(note) = &note {
                        note.refused(e.error.kind().spec().slug);
                    }
                    e.into_response(&request_id)
                });
                Ok(finish(stamp_request_id(response, &request_id)))
            });
        }
        let body_timeout = self.body_timeout;
        let note = request.extensions().get::<AccessNote>().cloned();
        let counted = note.clone();
        let answer = self.routed.call(
            request.map(|body| streamed_body(ReceivedBody::new(body, counted), body_timeout)),
        );
        Box::pin(async move {
            let response = answer.await.unwrap_or_else(|e| {
                if let Some(note) = &note {
                    let slug = e.error.kind().spec().slug;
                    // An upstream's failure came after the checks let the request through.
                    if e.error.origin() == Origin::Upstream {
                        note.failed(slug);
                    } else {
                        note.refused(slug);
                    }
                }
                e.into_response(&request_id)
            });
            Ok(finish(stamp_request_id(response, &request_id)))
        })
    }
}
