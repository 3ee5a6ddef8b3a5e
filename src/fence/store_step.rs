//! A fenced write's store step, through one door whichever layer owns it: the fence (plain), the
//! idempotency layer (with the intent's begin), the ordering gate (with the key's turn), a claim
//! and the embedded layer. The call is bounded by the store timeout, its answer counted, and
//! accepted / stale / failed / timed out mapped to the request's verdict here and nowhere else.

use std::future::Future;
use std::time::Duration;

use crate::config::Compare;
use crate::error::{GatewayError, RequestError};
use crate::guard::CheckedStore;
use crate::proxy::extensions::Admission;
use crate::route::CompiledRoute;
use crate::route::RouteCounters;
use crate::store::{Advance, StoreError};

/// A store call's answer, or the moment its timeout ran out.
pub type Bounded<T> = Result<Result<T, StoreError>, tokio::time::error::Elapsed>;

/// One fenced write as its store step sees it: the key, the token, how they compare, how long
/// the store may take, and the route's counters (none for a claim or the embedded layer).
#[derive(Debug, Clone, Copy)]
pub struct FencedWrite<'a> {
    pub key: &'a str,
    pub token: u64,
    pub compare: Compare,
    pub store_timeout: Duration,
    pub counters: Option<&'a RouteCounters>,
}

impl<'a> FencedWrite<'a> {
    /// `admission` on `route`, counted in the route's counters.
    #[inline]
    pub fn on_route(route: &'a CompiledRoute, admission: &'a Admission) -> FencedWrite<'a> {
        FencedWrite {
            key: &admission.key,
            token: admission.token,
            compare: route.fence.compare,
            store_timeout: route.fence.store_timeout,
            counters: Some(route.counters()),
        }
    }

    /// The plain step: the store's own compare-and-advance. `Ok` is the mark the token replaced.
    pub fn advance<'s>(
        &'s self,
        store: &'s CheckedStore,
    ) -> impl Future<Output = Result<Option<u64>, RequestError>> + 's {
        self.advance_as("advance", store)
    }

    /// [`advance`](Self::advance), counted in the store metrics under `op`.
    pub async fn advance_as(
        &self,
        op: &'static str,
        store: &CheckedStore,
    ) -> Result<Option<u64>, RequestError> {
        // A token the cache already refuses is answered as the store call would answer it,
        // without the call's future or its timer: a flood of stale writes costs no more than it
        // must.
        if let Some(current) = store.cached_refusal(self.key, self.token, self.compare) {
            return Err(self.stale(current));
        }
        let call = store.advance_as(op, self.key, self.token, self.compare);
        let answered = self.bounded(async { Ok(Some((call.await?, ()))) }).await;
        self.verdict(answered)
            .map(|made| made.and_then(|(previous, ())| previous))
    }

    /// The step that also carries `T` (the intent's begin): `Ok` is what else it answered, once
    /// the token was accepted.
    pub async fn advance_with<T>(
        &self,
        call: impl Future<Output = Result<(Advance, T), StoreError>>,
    ) -> Result<T, RequestError> {
        let answered = self.bounded(async { Ok(Some(call.await?)) }).await;
        match self.verdict(answered)? {
            Some((_, carried)) => Ok(carried),
            None => Err(GatewayError::Internal(
                "a store step that must compare answered without comparing",
            )
            .for_key(self.key)),
        }
    }

    /// The step that may compare nothing (the key's turn, which another replica can hold):
    /// `Ok(None)` when it made no comparison, else what else it answered once the token was
    /// accepted.
    pub async fn try_advance_with<T>(
        &self,
        call: impl Future<Output = Result<Option<(Advance, T)>, StoreError>>,
    ) -> Result<Option<T>, RequestError> {
        let answered = self.bounded(call).await;
        Ok(self.verdict(answered)?.map(|(_, carried)| carried))
    }

    /// A stale token's refusal, counted.
    #[inline]
    pub fn stale(&self, current: u64) -> RequestError {
        self.count(|counters| &counters.stale);
        GatewayError::StaleFence {
            token: self.token,
            current,
        }
        .for_key(self.key)
    }

    async fn bounded<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Bounded<T> {
        tokio::time::timeout(self.store_timeout, call).await
    }

    /// The one mapping of a store step's answer to the request's verdict: accepted (counted, and
    /// counted as an advance when the mark rose), stale, or the store failed or timed out.
    /// `Ok(Some((replaced, carried)))` for an accepted token, `Ok(None)` for a step that compared
    /// nothing.
    fn verdict<T>(
        &self,
        answered: Bounded<Option<(Advance, T)>>,
    ) -> Result<Option<(Option<u64>, T)>, RequestError> {
        match answered {
            Ok(Ok(None)) => Ok(None),
            Ok(Ok(Some((Advance::Accepted { previous }, carried)))) => {
                self.count(|counters| &counters.accepted);
                if previous.is_none_or(|previous| self.token > previous) {
                    self.count(|counters| &counters.advanced);
                }
                Ok(Some((previous, carried)))
            }
            Ok(Ok(Some((Advance::Stale { current }, _)))) => Err(self.stale(current)),
            Ok(Err(source)) => {
                self.count(|counters| &counters.store_errors);
                Err(store_failed(self.key, source))
            }
            Err(_elapsed) => {
                self.count(|counters| &counters.store_errors);
                Err(store_timed_out(self.key, self.store_timeout))
            }
        }
    }

    #[inline]
    fn count(&self, counter: impl FnOnce(&RouteCounters) -> &prometheus::IntCounter) {
        if let Some(counters) = self.counters {
            RouteCounters::bump(counter(counters));
        }
    }
}

/// A store call for `key` that is not an advance (a mark read, an intent's begin or outcome)
/// bounded by `timeout`, its failure or timeout made the error that answers the request.
pub async fn store_call<T>(
    key: &str,
    timeout: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, RequestError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(store_failed(key, source)),
        Err(_elapsed) => Err(store_timed_out(key, timeout)),
    }
}

/// A failed store call for `key` as the request's error: 503 `store-unavailable` (or the kind of
/// the store's own refusal, such as an untrusted store).
pub fn store_failed(key: &str, source: StoreError) -> RequestError {
    GatewayError::StoreFailed { source }.for_key(key)
}

fn store_timed_out(key: &str, after: Duration) -> RequestError {
    GatewayError::StoreTimeout { after }.for_key(key)
}
