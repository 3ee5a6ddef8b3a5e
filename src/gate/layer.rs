//! `GateLayer` → `Gate<S>`: serializes admitted writes per key (route `ordering = "serialize"`).
//! A request waits for its key's turn (bounded by `gate_timeout`), then re-checks its token: if a
//! newer one was admitted while it waited, it is refused with 409 and never forwarded. With a
//! cross-replica gate it also makes the advance routing left to it, in the store step that
//! takes the key's turn, for a key open in this process; the forward must end before the turn's
//! deadline.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};
use http_body_util::BodyExt as _;
use tower::{Layer, Service};

use super::read_ahead::{read_ahead, ReadAhead};
use super::{
    Busy, CrossReplicaGate, CrossReplicaGateError, CrossReplicaPass, GatedBody, Gates, LocalPass,
};
use crate::body::budget::MemoryBudget;
use crate::body::{ProxyBody, RequestBody};
use crate::config::Ordering;
use crate::error::{GatewayError, RequestError};
use crate::fence::{store_call, store_failed, FencedWrite};
use crate::guard::{AdvanceMade, CheckedStore};
use crate::metrics::Metrics;
use crate::proxy::extensions::Admission;
use crate::proxy::{ProxyFuture, StackService};
use crate::route::{AdvanceBy, CompiledRoute, RouteMatch};
use crate::store::{Advance, StoreError};

#[derive(Clone)]
pub struct GateLayer {
    gates: Gates,
    store: Arc<CheckedStore>,
    metrics: Arc<Metrics>,
    budget: MemoryBudget,
}

impl GateLayer {
    /// Responses read ahead are held under `budget`.
    pub fn new(
        gates: Gates,
        store: Arc<CheckedStore>,
        metrics: Arc<Metrics>,
        budget: MemoryBudget,
    ) -> GateLayer {
        GateLayer {
            gates,
            store,
            metrics,
            budget,
        }
    }
}

impl<S> Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            gates: self.gates.clone(),
            store: Arc::clone(&self.store),
            metrics: Arc::clone(&self.metrics),
            budget: self.budget.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct Gate<S> {
    gates: Gates,
    store: Arc<CheckedStore>,
    metrics: Arc<Metrics>,
    budget: MemoryBudget,
    inner: S,
}

/// How long after its turn was taken a forward can still run: the route's timeout, the re-check's
/// store read, and the time to tear the upstream connection down. A turn is leased for this plus
/// the store's `turn_margin`, and the forward is cut at its end if the lease was not renewed.
const TEARDOWN: Duration = Duration::from_secs(1);
/// A read-ahead under a cross-replica turn stops this long before the turn's deadline, so the
/// keeper can still renew it for the body that streams on.
const READ_AHEAD_SLACK: Duration = Duration::from_secs(1);

fn turn_hold(route: &CompiledRoute) -> Duration {
    route.timeout + route.fence.store_timeout + TEARDOWN
}

/// Both gates of one forward, released together when the response body ends.
struct Passes {
    // Field order is drop order: the cross-replica turn goes first, then waiters in this process run.
    cross_replica: Option<CrossReplicaPass>,
    _local: LocalPass,
}

impl<S> Service<Request<RequestBody>> for Gate<S>
where
    S: StackService,
{
    type Response = Response<ProxyBody>;
    type Error = RequestError;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let extensions = request.extensions();
        let routed = extensions.get::<RouteMatch>();
        let route = routed.map(|m| &m.route);
        let owes_advance = route.is_some_and(|route| route.advance_by() == AdvanceBy::Turn);
        let (route, admission) = match (route, extensions.get::<Admission>()) {
            // The route leaves its advance to this gate (a serialized route on a store that takes
            // turns: PostgreSQL, Redis, etcd).
            (Some(route), Some(admission)) if owes_advance => {
                (Arc::clone(route), Arrival::Owed(admission.clone()))
            }
            (Some(route), Some(admission)) if route.fence.ordering != Ordering::None => {
                (Arc::clone(route), Arrival::Advanced(admission.clone()))
            }
            // Nothing admitted to serialize: the inner service's own future, not another box.
            _ => return self.inner.call(request),
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gates = self.gates.clone();
        let store = Arc::clone(&self.store);
        let metrics = Arc::clone(&self.metrics);
        let budget = self.budget.clone();
        Box::pin(async move {
            let waiting = std::time::Instant::now();
            let entered = match admission {
                Arrival::Advanced(admission) => {
                    enter(&gates, &route, admission, LocalTurn::Ask).await
                }
                Arrival::Owed(admission) => {
                    advance_and_enter(&gates, &route, admission, store.as_ref()).await
                }
            };
            metrics
                .gate_wait
                .with_label_values(&[&route.name])
                .observe(waiting.elapsed().as_secs_f64());
            let Entered {
                passes,
                admission,
                checked,
            } = entered?;
            if !checked {
                let cached = || store.known_mark(&admission.key);
                match recheck_source(
                    passes.cross_replica.as_ref(),
                    passes._local.waited(),
                    cached,
                ) {
                    Recheck::Known(current) => superseded(current, &admission)?,
                    Recheck::AskStore => recheck(store.as_ref(), &route, &admission).await?,
                }
            }
            let key = admission.key;
            // The forward, and how long its response may be read ahead: the route's timeout, or
            // under a cross-replica turn until shortly before the turn's deadline. On an upstream
            // error or timeout the passes drop here, after the upstream call (and with it its
            // connection) has been dropped.
            let (response, until) = match passes
                .cross_replica
                .as_ref()
                .map(CrossReplicaPass::deadline)
            {
                None => (
                    inner.call(request).await?,
                    tokio::time::Instant::now() + route.timeout,
                ),
                Some(deadline) => {
                    let response = tokio::time::timeout_at(deadline, inner.call(request))
                        .await
                        .map_err(|_| GatewayError::TurnLapsed.for_key(key))??;
                    let renewed = passes
                        .cross_replica
                        .as_ref()
                        .map_or(deadline, CrossReplicaPass::deadline);
                    let until = renewed.checked_sub(READ_AHEAD_SLACK).unwrap_or(deadline);
                    (response, until)
                }
            };
            let (head, body) = response.into_parts();
            let body = match read_ahead(body, route.fence.response_read_ahead, &budget, until).await
            {
                // The upstream is done: the key's turn ends here, whatever the client does.
                Ok(ReadAhead::Whole(body)) => return Ok(Response::from_parts(head, body)),
                Ok(ReadAhead::Partial(body)) => body,
                Err(_) => return Err(GatewayError::UpstreamBodyFailed.into()),
            };
            let body = match passes.cross_replica.as_ref().map(CrossReplicaPass::watch) {
                Some(watch) => GatedBody::watched(body, watch, passes).boxed(),
                None => GatedBody::new(body, passes).boxed(),
            };
            Ok(Response::from_parts(head, body))
        })
    }
}

/// How a request reaches the gate.
enum Arrival {
    /// Its mark was advanced before it came here.
    Advanced(Admission),
    /// Its route leaves the advance to the gate ([`AdvanceBy::Turn`]).
    Owed(Admission),
}

/// A request that holds its key's gate.
struct Entered {
    passes: Passes,
    admission: Admission,
    /// Whether its token was compared with the key's mark after it entered (its advance was made
    /// under the key's turn), so no re-check is due.
    checked: bool,
}

/// The request's turn in this process, as far as it has got.
enum LocalTurn {
    /// Not asked for yet.
    Ask,
    /// The key was busy: to be queued for.
    Busy(Busy),
    /// Taken.
    Taken(LocalPass),
}

/// The advance routing left to the gate. A key open in this process has its cross-replica turn
/// taken and its mark advanced in one store step, so its token is compared with the mark under
/// the turn. A key busy here is advanced at once, as the fence would have, then waits for its
/// turn and is re-checked like any admitted request: a newer token arriving while it waits still
/// supersedes it.
async fn advance_and_enter(
    gates: &Gates,
    route: &CompiledRoute,
    admission: Admission,
    store: &CheckedStore,
) -> Result<Entered, RequestError> {
    let local = match (&gates.cross_replica, gates.local.try_enter(&admission.key)) {
        (Some(gate), Ok(local)) => {
            return lock_and_advance(gate, local, route, admission, store).await
        }
        (None, Ok(local)) => LocalTurn::Taken(local),
        (_, Err(busy)) => LocalTurn::Busy(busy),
    };
    FencedWrite::on_route(route, &admission)
        .advance(store)
        .await?;
    enter(gates, route, admission, local).await
}

/// Takes the key's cross-replica turn and advances its mark in one store step (bounded by
/// `store_timeout`, like any advance). A key another replica holds is waited for (bounded by
/// `gate_timeout`) and then advanced under its turn.
async fn lock_and_advance(
    gate: &CrossReplicaGate,
    local: LocalPass,
    route: &CompiledRoute,
    admission: Admission,
    store: &CheckedStore,
) -> Result<Entered, RequestError> {
    let started = Instant::now();
    let write = FencedWrite::on_route(route, &admission);
    let hold = turn_hold(route);
    let taken = write
        .try_advance_with(take_and_advance(gate, store, write, hold))
        .await?;
    let pass = match taken {
        Some(pass) => pass,
        // Another replica holds the key's turn: wait for it, then advance under it.
        None => {
            let left = route.fence.gate_timeout.saturating_sub(started.elapsed());
            let pass = gate
                .enter(write.key, left, hold)
                .await
                .map_err(|error| cross_replica_error(route, write.key, error))?;
            write.advance_as("gate_advance_after_wait", store).await?;
            pass
        }
    };
    Ok(Entered {
        passes: Passes {
            cross_replica: Some(pass),
            _local: local,
        },
        admission,
        checked: true,
    })
}

/// The store step that takes the key's cross-replica turn and advances its mark, its answer
/// checked and recorded by the guard as the guard's own advances are. `None` when another replica
/// holds the turn: then it took nothing and compared nothing.
async fn take_and_advance(
    gate: &CrossReplicaGate,
    store: &CheckedStore,
    write: FencedWrite<'_>,
    hold: Duration,
) -> Result<Option<(Advance, CrossReplicaPass)>, StoreError> {
    let started = Instant::now();
    // The mark known before the step: an answer below it means the store forgot. Read now, not
    // when the answer comes: by then other requests of the key may have raised it.
    let floor = store.known_mark(write.key);
    let tried = gate
        .try_enter_and_advance(write.key, write.token, hold)
        .await;
    let (pass, replaced) = match tried {
        Ok(None) => return Ok(None),
        Ok(Some((pass, replaced))) => (Some(pass), Ok(replaced)),
        Err(source) => (None, Err(source)),
    };
    let made = AdvanceMade {
        op: "gate_advance",
        key: write.key,
        token: write.token,
        compare: write.compare,
        floor,
        took: started.elapsed(),
    };
    let advance = store.settle_advance(made, replaced)?;
    Ok(pass.map(|pass| (advance, pass)))
}

/// Waits for the key's turn in this process, then across replicas, within `gate_timeout`.
async fn enter(
    gates: &Gates,
    route: &CompiledRoute,
    admission: Admission,
    local: LocalTurn,
) -> Result<Entered, RequestError> {
    let started = Instant::now();
    let wait = route.fence.gate_timeout;
    let timeout = || GatewayError::GateTimeout { after: wait }.for_key(admission.key.as_str());
    let local = match local {
        LocalTurn::Taken(pass) => pass,
        LocalTurn::Busy(busy) => tokio::time::timeout(wait, busy.wait())
            .await
            .map_err(|_| timeout())?,
        LocalTurn::Ask => tokio::time::timeout(wait, gates.local.enter(&admission.key))
            .await
            .map_err(|_| timeout())?,
    };
    let cross_replica = match &gates.cross_replica {
        None => None,
        Some(gate) => {
            let left = wait.saturating_sub(started.elapsed());
            match gate.enter(&admission.key, left, turn_hold(route)).await {
                Ok(pass) => Some(pass),
                Err(error) => return Err(cross_replica_error(route, &admission.key, error)),
            }
        }
    };
    Ok(Entered {
        passes: Passes {
            cross_replica,
            _local: local,
        },
        admission,
        checked: false,
    })
}

/// The answer to a request the cross-replica gate did not let in.
fn cross_replica_error(
    route: &CompiledRoute,
    key: &str,
    error: CrossReplicaGateError,
) -> RequestError {
    match error {
        CrossReplicaGateError::Timeout(_) => GatewayError::GateTimeout {
            after: route.fence.gate_timeout,
        }
        .for_key(key),
        CrossReplicaGateError::Store(source) => store_failed(key, source),
    }
}

/// Where the re-check's mark comes from.
#[derive(Debug, PartialEq, Eq)]
enum Recheck {
    /// Already known: the mark read under the cross-replica turn, or this process's cached mark.
    Known(Option<u64>),
    /// Read from the store.
    AskStore,
}

/// Picks the re-check's source once a request holds its key's gate.
///
/// - A cross-replica turn comes with the mark read once the turn was held: nothing newer can
///   have been admitted by any replica in between that the read missed.
/// - A request that found its key open in this process and has no cross-replica turn (Redis, the
///   embedded store) uses the cached mark. Every admission in this process raises the cache
///   before its request reaches the gate, and its own admission put the key there; a newer token
///   admitted here since, even one already forwarded, is in the cache. Other replicas are not
///   ordered against this one without a cross-replica gate, so a store read would only narrow a race it
///   cannot close. A key no longer cached (evicted) is read from the store.
/// - Otherwise (it waited for its turn in this process) the store is read.
fn recheck_source(
    cross_replica: Option<&CrossReplicaPass>,
    waited: bool,
    cached: impl FnOnce() -> Option<u64>,
) -> Recheck {
    if let Some(pass) = cross_replica {
        return Recheck::Known(pass.mark_under_turn());
    }
    if waited {
        return Recheck::AskStore;
    }
    cached().map_or(Recheck::AskStore, |mark| Recheck::Known(Some(mark)))
}

/// Refuses the request if `current`, its key's mark read after it entered the gate, is above its
/// token: a newer one was admitted while it waited.
fn superseded(current: Option<u64>, admission: &Admission) -> Result<(), RequestError> {
    match current {
        Some(current) if current > admission.token => Err(GatewayError::Superseded {
            token: admission.token,
            current,
        }
        .for_key(admission.key.as_str())),
        _ => Ok(()),
    }
}

/// Refuses the request if a newer token than its own was admitted while it waited.
async fn recheck(
    store: &CheckedStore,
    route: &CompiledRoute,
    admission: &Admission,
) -> Result<(), RequestError> {
    let current = store_call(
        &admission.key,
        route.fence.store_timeout,
        store.current(&admission.key),
    )
    .await?;
    superseded(current, admission)
}

#[cfg(test)]
mod tests {
    use super::{recheck_source, Recheck};

    #[test]
    fn the_store_is_asked_only_after_a_wait_or_for_a_key_no_longer_cached() {
        // Open key, no cross-replica gate, cached: the cache answers.
        assert_eq!(
            recheck_source(None, false, || Some(7)),
            Recheck::Known(Some(7))
        );
        // It waited for its turn, or the key was evicted: the store is read.
        assert_eq!(recheck_source(None, true, || Some(7)), Recheck::AskStore);
        assert_eq!(recheck_source(None, false, || None), Recheck::AskStore);
    }
}
