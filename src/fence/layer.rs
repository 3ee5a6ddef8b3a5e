//! `FenceLayer` → `Fence<S>`: the fence check of docs/design.md §2 as a tower layer. It renders the
//! resource key, reads the token, checks the lock authority's signature and `max_advance` when the
//! route asks for them, and compare-and-advances the key's mark in the store before the inner
//! service (and so the upstream) sees the request.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future;
use http::{Request, Response};
use tower::{Layer, Service};

use super::limit::check_max_advance;
use super::signature::SignatureError;
use super::token::{read_fence_header, TokenError};
use crate::config::{FenceMode, OnStoreError, Ordering};
use crate::error::{GatewayError, Origin};
use crate::proxy::{ProxyBody, ProxyFuture, RequestBody, StackService};
use crate::route::{CompiledRoute, RequestParts, RouteMatch};
use crate::stats::RouteCounters;
use crate::store::{decide, Advance, FenceStore, StoreError};

/// A fenced request the fence admitted: its resource key and token, for the layers after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub key: String,
    pub token: u64,
}

/// A fenced request that passed every check but the compare-and-advance, which a later layer
/// makes together with work of its own: on an idempotent route the idempotency layer, with
/// recording the intent (one store round where the backend allows it; see
/// [`advance_and_begin`](crate::idempotency)); on a serialized route with a cross-replica gate
/// (PostgreSQL) the ordering gate, in the statement that takes the key's lock. Only under
/// `mode = "enforce"` with `on_store_error = "fail_closed"`, where a refused advance always
/// ends the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeferredAdvance {
    pub key: String,
    pub token: u64,
}

/// What the fence decided for a request it did not refuse.
enum Verdict {
    Admitted(Admitted),
    Deferred(DeferredAdvance),
}

#[derive(Clone)]
pub struct FenceLayer {
    store: Arc<dyn FenceStore>,
    gate_advances: bool,
}

impl FenceLayer {
    /// `gate_advances`: the ordering gate can advance a key's mark as it takes the key's
    /// cross-replica lock, so serialized routes leave the advance to it.
    pub fn new(store: Arc<dyn FenceStore>, gate_advances: bool) -> FenceLayer {
        FenceLayer {
            store,
            gate_advances,
        }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = Fence<S>;

    fn layer(&self, inner: S) -> Fence<S> {
        Fence {
            store: Arc::clone(&self.store),
            gate_advances: self.gate_advances,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Fence<S> {
    store: Arc<dyn FenceStore>,
    gate_advances: bool,
    inner: S,
}

impl<S> Service<Request<RequestBody>> for Fence<S>
where
    S: StackService,
{
    type Response = Response<ProxyBody>;
    type Error = GatewayError;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<RequestBody>) -> Self::Future {
        let Some(routed) = request.extensions().get::<RouteMatch>() else {
            return Box::pin(future::ready(Err(GatewayError::Internal(
                "request reached the fence without a route",
            ))));
        };
        if !routed.route.fences(request.method()) {
            // Nothing to check: the inner service's own future, not another box around it.
            return self.inner.call(request);
        }
        let routed = routed.clone();
        // The inner service was polled ready; keep that one and leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let store = Arc::clone(&self.store);
        let defers = defers_advance(&routed.route, self.gate_advances);
        Box::pin(async move {
            let route = routed.route;
            let verdict = match read_key_and_token(&route, &routed.captures, &request) {
                Ok((key, token)) => {
                    admit(&route, key, token, &request, store.as_ref(), defers).await
                }
                Err(refusal) => Err(refusal),
            };
            match (verdict, route.fence.mode) {
                (Ok(Verdict::Admitted(admitted)), _) => {
                    request.extensions_mut().insert(admitted);
                }
                (Ok(Verdict::Deferred(deferred)), _) => {
                    request.extensions_mut().insert(deferred);
                }
                (Err(refusal), FenceMode::Observe) => observe(&route, &refusal),
                (Err(refusal), _) if fails_open(&route, &refusal) => {
                    RouteCounters::bump(&route.counters.failed_open);
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
) -> Result<(String, u64), GatewayError> {
    let counters = &route.counters;
    let Some(template) = &route.resource_key else {
        return Err(GatewayError::Internal(
            "a fenced route without a resource key",
        ));
    };
    let parts = RequestParts {
        captures,
        headers: request.headers(),
        query: request.uri().query(),
    };
    let key = template.render(&parts).map_err(|error| {
        RouteCounters::bump(&counters.invalid);
        GatewayError::KeyUnavailable {
            route: route.name.clone(),
            error,
        }
    })?;
    let token = read_fence_header(request.headers(), &route.fence.header).map_err(|error| {
        let counter = match error {
            TokenError::Missing => &counters.missing,
            _ => &counters.invalid,
        };
        RouteCounters::bump(counter);
        GatewayError::Token {
            route: route.name.clone(),
            key: key.clone(),
            error,
        }
    })?;
    Ok((key, token))
}

/// The checks after the token is read, cheapest and store-free first: the signature, then
/// `max_advance`, then the compare-and-advance (or, when `defers`, a look at the cache and the
/// advance left to a later layer; see [`DeferredAdvance`]). A refused signature never reaches
/// the store.
async fn admit<B>(
    route: &CompiledRoute,
    key: String,
    token: u64,
    request: &Request<B>,
    store: &dyn FenceStore,
    defers: bool,
) -> Result<Verdict, GatewayError> {
    let counters = &route.counters;
    if let Some(signature) = &route.fence.signature {
        signature
            .verify(request.headers(), &key, token)
            .map_err(|error| {
                let counter = match error {
                    SignatureError::Missing => &counters.unsigned,
                    _ => &counters.bad_signature,
                };
                RouteCounters::bump(counter);
                GatewayError::Signature {
                    route: route.name.clone(),
                    key: key.clone(),
                    error,
                }
            })?;
    }
    if let Some(max_advance) = route.fence.max_advance {
        let limited = check_max_advance(
            &route.name,
            &key,
            token,
            max_advance,
            store,
            route.fence.store_timeout,
        )
        .await;
        if let Err(refusal) = limited {
            let counter = match refusal {
                GatewayError::TooFarAhead { .. } => &counters.too_far_ahead,
                _ => &counters.store_errors,
            };
            RouteCounters::bump(counter);
            return Err(refusal);
        }
    }
    if defers {
        // A token the cache already refuses is answered now, before the body is read.
        if let Some(mark) = store.known_mark(&key) {
            if let Advance::Stale { current } = decide(Some(mark), token, route.fence.compare) {
                return Err(refuse_stale(route, key, token, current));
            }
        }
        return Ok(Verdict::Deferred(DeferredAdvance { key, token }));
    }
    let advanced = tokio::time::timeout(
        route.fence.store_timeout,
        store.advance(&key, token, route.fence.compare),
    )
    .await;
    judge_advance(route, key, token, advanced).map(|key| Verdict::Admitted(Admitted { key, token }))
}

/// Whether a later layer makes the route's compare-and-advance (see [`DeferredAdvance`]): the
/// idempotency layer on an idempotent route, else the ordering gate on a serialized one when
/// `gate_advances`.
fn defers_advance(route: &CompiledRoute, gate_advances: bool) -> bool {
    let later = route.idempotency.is_some()
        || (gate_advances && route.fence.ordering == Ordering::Serialize);
    later
        && route.fence.mode == FenceMode::Enforce
        && route.fence.on_store_error == OnStoreError::FailClosed
}

/// Counts a compare-and-advance's answer and turns a refusal into the error that answers the
/// request; `Ok` carries the key of a request that may pass.
pub fn judge_advance(
    route: &CompiledRoute,
    key: String,
    token: u64,
    advanced: Result<Result<Advance, StoreError>, tokio::time::error::Elapsed>,
) -> Result<String, GatewayError> {
    let counters = &route.counters;
    match advanced {
        Ok(Ok(Advance::Accepted { previous })) => {
            RouteCounters::bump(&counters.accepted);
            if previous.is_none_or(|p| token > p) {
                RouteCounters::bump(&counters.advanced);
            }
            Ok(key)
        }
        Ok(Ok(Advance::Stale { current })) => Err(refuse_stale(route, key, token, current)),
        Ok(Err(source)) => {
            RouteCounters::bump(&counters.store_errors);
            Err(GatewayError::StoreFailed {
                route: route.name.clone(),
                key,
                source,
            })
        }
        Err(_elapsed) => {
            RouteCounters::bump(&counters.store_errors);
            Err(GatewayError::StoreTimeout {
                route: route.name.clone(),
                key,
                after: route.fence.store_timeout,
            })
        }
    }
}

/// Counts a stale token and makes its refusal.
fn refuse_stale(route: &CompiledRoute, key: String, token: u64, current: u64) -> GatewayError {
    RouteCounters::bump(&route.counters.stale);
    GatewayError::StaleFence {
        route: route.name.clone(),
        key,
        token,
        current,
    }
}

/// Whether the route forwards despite this store failure.
fn fails_open(route: &CompiledRoute, refusal: &GatewayError) -> bool {
    // A store that answers but is not trusted (it forgot marks, or is not the adopted one) has
    // not failed: forwarding unchecked past it would re-admit every zombie. Refused, always.
    let untrusted = matches!(
        refusal,
        GatewayError::StoreFailed {
            source: StoreError::Untrusted { .. },
            ..
        }
    );
    route.fence.on_store_error == OnStoreError::FailOpen
        && refusal.origin() == Origin::Store
        && !untrusted
}

/// Observe mode: the refusal is counted (by the check) and logged, and the request goes on.
fn observe(route: &CompiledRoute, refusal: &GatewayError) {
    RouteCounters::bump(&route.counters.observed_refusals);
    tracing::warn!(route = %route.name, would_refuse = %refusal, "observe mode: forwarding a request enforce would refuse");
}
