//! `FenceLayer` → `Fence<S>`: the fence check of docs/design.md §2 as a tower layer. It renders the
//! resource key, reads the token, checks the lock authority's signature and `max_advance` when the
//! route asks for them, and compare-and-advances the key's mark in the store before the inner
//! service (and so the upstream) sees the request — unless routing gave the advance to a later
//! layer (`CompiledRoute::advance_by`).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future;
use http::{Request, Response};
use tower::{Layer, Service};

use super::authority::check_authority;
use super::limit::check_max_advance;
use super::store_step::FencedWrite;
use crate::authority::Authorities;
use crate::body::{ProxyBody, RequestBody};
use crate::config::{FenceMode, OnStoreError};
use crate::error::{ErrorKind, GatewayError, Origin, RequestError};
use crate::guard::CheckedStore;
use crate::proxy::extensions::Admission;
use crate::proxy::{ProxyFuture, StackService};
use crate::route::RouteCounters;
use crate::route::{AdvanceBy, CompiledRoute, RequestParts, RouteMatch};
use crate::telemetry::{AccessNote, Verdict};
use crate::token::{read_fence_header, SignatureError, TokenError};

#[derive(Clone)]
pub struct FenceLayer {
    store: Arc<CheckedStore>,
    authorities: Option<Arc<Authorities>>,
}

impl FenceLayer {
    /// Without `authorities`, routes with a lock authority refuse their fenced writes (503).
    pub fn new(store: Arc<CheckedStore>, authorities: Option<Arc<Authorities>>) -> FenceLayer {
        FenceLayer { store, authorities }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = Fence<S>;

    fn layer(&self, inner: S) -> Fence<S> {
        Fence {
            store: Arc::clone(&self.store),
            authorities: self.authorities.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Fence<S> {
    store: Arc<CheckedStore>,
    authorities: Option<Arc<Authorities>>,
    inner: S,
}

impl<S> Service<Request<RequestBody>> for Fence<S>
where
    S: StackService,
{
    type Response = Response<ProxyBody>;
    type Error = RequestError;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<RequestBody>) -> Self::Future {
        let Some(routed) = request.extensions().get::<RouteMatch>() else {
            return Box::pin(future::ready(Err(GatewayError::Internal(
                "request reached the fence without a route",
            )
            .into())));
        };
        if !routed.route.fences(request.method()) {
            // Nothing to check: the inner service's own future, not another box around it.
            return self.inner.call(request);
        }
        // The key and token are read here, so the future holds the route alone, not a copy of
        // the match's captures and path.
        let route = Arc::clone(&routed.route);
        let by = route.advance_by();
        let read = read_key_and_token(&route, &routed.captures, &request);
        // The inner service was polled ready; keep that one and leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let store = Arc::clone(&self.store);
        let authorities = self.authorities.clone();
        Box::pin(async move {
            let note = request.extensions().get::<AccessNote>().cloned();
            let verdict = match read {
                Ok(admission) => {
                    if let Some(note) = &note {
                        note.key_and_token(&admission.key, admission.token);
                    }
                    let checks = Checks {
                        store: store.as_ref(),
                        authorities: authorities.as_deref(),
                        by,
                    };
                    admit(&route, admission, &request, checks).await
                }
                Err(refusal) => Err(refusal),
            };
            match (verdict, route.fence.mode) {
                (Ok(admission), _) => {
                    request.extensions_mut().insert(admission);
                }
                (Err(refusal), FenceMode::Observe) => {
                    observe(&route, &refusal);
                    if let Some(note) = &note {
                        note.verdict(Verdict::Observed);
                    }
                }
                (Err(refusal), _) if fails_open(&route, &refusal) => {
                    RouteCounters::bump(&route.counters().failed_open);
                    if let Some(note) = &note {
                        note.verdict(Verdict::FailedOpen);
                    }
                    tracing::warn!(route = %route.name, error = %refusal, "store failed: forwarding unchecked (on_store_error = \"fail_open\")");
                }
                (Err(refusal), _) => return Err(refusal),
            }
            inner.call(request).await
        })
    }
}

/// Renders the request's resource key and reads its token.
fn read_key_and_token<B>(
    route: &CompiledRoute,
    captures: &crate::route::Captures,
    request: &Request<B>,
) -> Result<Admission, RequestError> {
    let counters = route.counters();
    let Some(template) = &route.resource_key else {
        return Err(GatewayError::Internal("a fenced route without a resource key").into());
    };
    let parts = RequestParts {
        captures,
        headers: request.headers(),
        query: request.uri().query(),
        body: None,
    };
    let key = template.render(&parts).map_err(|error| {
        RouteCounters::bump(&counters.invalid);
        GatewayError::KeyUnavailable { error }
    })?;
    match read_fence_header(request.headers(), &route.fence.header) {
        Ok(token) => Ok(Admission { key, token }),
        Err(error) => {
            let counter = match error {
                TokenError::Missing => &counters.missing,
                _ => &counters.invalid,
            };
            RouteCounters::bump(counter);
            Err(GatewayError::Token { error }.for_key(key))
        }
    }
}

/// What a fenced request is checked with.
struct Checks<'a> {
    store: &'a CheckedStore,
    authorities: Option<&'a Authorities>,
    /// Which layer makes the advance.
    by: AdvanceBy,
}

/// The checks after the token is read, cheapest and store-free first: the signature, then
/// `max_advance`, then the lock authority (when the route has one), then the compare-and-advance
/// — or, when another layer owns the advance (`by`), a look at the cache, so that a token it
/// already refuses is answered before the body is read. A refused signature never reaches the
/// store.
async fn admit<B>(
    route: &CompiledRoute,
    admission: Admission,
    request: &Request<B>,
    checks: Checks<'_>,
) -> Result<Admission, RequestError> {
    let Checks {
        store,
        authorities,
        by,
    } = checks;
    let counters = route.counters();
    let Admission { key, token } = &admission;
    if let Some(signature) = &route.fence.signature {
        signature
            .verify(request.headers(), key, *token)
            .map_err(|error| {
                let counter = match error {
                    SignatureError::Missing => &counters.unsigned,
                    _ => &counters.bad_signature,
                };
                RouteCounters::bump(counter);
                GatewayError::Signature { error }.for_key(key.as_str())
            })?;
    }
    if let Some(max_advance) = route.fence.max_advance {
        let limited =
            check_max_advance(key, *token, max_advance, store, route.fence.store_timeout).await;
        if let Err(refusal) = limited {
            let counter = match refusal.error {
                GatewayError::TooFarAhead { .. } => &counters.too_far_ahead,
                _ => &counters.store_errors,
            };
            RouteCounters::bump(counter);
            return Err(refusal);
        }
    }
    check_authority(route, &admission, authorities).await?;
    let write = FencedWrite::on_route(route, &admission);
    if by != AdvanceBy::Fence {
        if let Some(current) = store.cached_refusal(key, *token, route.fence.compare) {
            return Err(write.stale(current));
        }
        return Ok(admission);
    }
    write.advance(store).await?;
    Ok(admission)
}

/// Whether the route forwards despite this store failure.
fn fails_open(route: &CompiledRoute, refusal: &RequestError) -> bool {
    // A store that answers but is not trusted (it forgot marks, or is not the adopted one) has
    // not failed: forwarding unchecked past it would re-admit every zombie. Refused, always.
    route.fence.on_store_error == OnStoreError::FailOpen
        && refusal.origin() == Origin::Store
        && refusal.kind() != ErrorKind::StoreUntrusted
}

/// Observe mode: the refusal is counted (by the check) and logged, and the request goes on.
fn observe(route: &CompiledRoute, refusal: &RequestError) {
    RouteCounters::bump(&route.counters().observed_refusals);
    tracing::warn!(route = %route.name, would_refuse = %refusal, "observe mode: forwarding a request enforce would refuse");
}
