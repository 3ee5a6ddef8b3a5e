//! The compare-and-advance of a fenced write, made in one place whichever layer owns it: the
//! store call bounded by the route's `store_timeout`, its answer counted in the route's counters,
//! and a refusal turned into the request's error.

use std::future::Future;
use std::time::Duration;

use crate::error::GatewayError;
use crate::extensions::Admission;
use crate::guard::CheckedStore;
use crate::route::CompiledRoute;
use crate::stats::RouteCounters;
use crate::store::{Advance, StoreError};

/// A store call's answer, or the moment `store_timeout` ran out.
pub type Bounded<T> = Result<Result<T, StoreError>, tokio::time::error::Elapsed>;

/// Runs a store step of a fenced write within the route's `store_timeout`.
pub async fn bounded<T>(
    route: &CompiledRoute,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Bounded<T> {
    tokio::time::timeout(route.fence.store_timeout, call).await
}

/// A store call for `key` bounded by `timeout`, its failure or timeout made the error that
/// answers the request: the one place a store step's failure becomes 503 `store-unavailable`.
pub async fn store_call<T>(
    key: &str,
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, GatewayError> {
    store_answer(key, timeout, tokio::time::timeout(timeout, call).await)
}

/// A bounded store call's answer for `key` as the request's error, if it failed or timed out.
pub fn store_answer<T>(
    key: &str,
    timeout: Duration,
    answer: Bounded<T>,
) -> Result<T, GatewayError> {
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(store_failed(key, source)),
        Err(_elapsed) => Err(GatewayError::StoreTimeout {
            key: key.to_owned(),
            after: timeout,
        }),
    }
}

/// A failed store call for `key` as the request's error.
pub fn store_failed(key: &str, source: StoreError) -> GatewayError {
    GatewayError::StoreFailed {
        key: key.to_owned(),
        source,
    }
}

/// Makes `admission`'s advance with `call` (the advance, and what else the same store step
/// carried): bounded, judged and counted. `Ok` is what else the step answered.
pub async fn make_advance<T>(
    route: &CompiledRoute,
    admission: &Admission,
    call: impl Future<Output = Result<(Advance, T), StoreError>>,
) -> Result<T, GatewayError> {
    let (advanced, carried) = match bounded(route, call).await {
        Ok(Ok((advance, carried))) => (Ok(Ok(advance)), Some(carried)),
        Ok(Err(source)) => (Ok(Err(source)), None),
        Err(elapsed) => (Err(elapsed), None),
    };
    judge(route, admission, advanced)?;
    carried.ok_or(GatewayError::Internal(
        "a store step passed an advance it did not answer",
    ))
}

/// Makes `admission`'s advance with the store's own compare-and-advance.
pub async fn advance(
    route: &CompiledRoute,
    admission: &Admission,
    store: &CheckedStore,
) -> Result<(), GatewayError> {
    // A token the cache already refuses is answered as the store call would answer it, without
    // the call's future or its timer: a flood of stale writes costs no more than it must.
    let compare = route.fence.compare;
    if let Some(current) = store.cached_refusal(&admission.key, admission.token, compare) {
        return Err(refuse_stale(route, admission, current));
    }
    let call = store.advance(&admission.key, admission.token, compare);
    make_advance(route, admission, async { Ok((call.await?, ())) }).await
}

/// Counts an advance's answer and turns a refusal into the error that answers the request.
pub fn judge(
    route: &CompiledRoute,
    admission: &Admission,
    advanced: Bounded<Advance>,
) -> Result<(), GatewayError> {
    let counters = route.counters();
    match advanced {
        Ok(Ok(Advance::Accepted { previous })) => {
            RouteCounters::bump(&counters.accepted);
            if previous.is_none_or(|p| admission.token > p) {
                RouteCounters::bump(&counters.advanced);
            }
            Ok(())
        }
        Ok(Ok(Advance::Stale { current })) => Err(refuse_stale(route, admission, current)),
        failed => {
            RouteCounters::bump(&counters.store_errors);
            store_answer(&admission.key, route.fence.store_timeout, failed).map(drop)
        }
    }
}

/// Counts a stale token and makes its refusal.
pub fn refuse_stale(route: &CompiledRoute, admission: &Admission, current: u64) -> GatewayError {
    RouteCounters::bump(&route.counters().stale);
    GatewayError::StaleFence {
        key: admission.key.clone(),
        token: admission.token,
        current,
    }
}
