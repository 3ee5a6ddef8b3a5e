//! `CheckedStore`: what the gateway puts in front of every backend. It refuses tokens below the
//! lower-bound cache without a round trip, keeps the cache up to date from the store's answers,
//! and stops trusting a store whose answers go below a mark already seen (a store that forgot).

use std::sync::Arc;
use std::time::Instant;

use super::cache::MarkCache;
use super::trust::StoreTrust;
use crate::config::Compare;
use crate::metrics::Metrics;
use crate::store::intents::BeginRequest;
use crate::store::{
    Advance, AdvanceMade, AdvancedAndBegun, FenceStore, StoreError, StoreFuture, StoreIdentity,
};

pub struct CheckedStore {
    inner: Arc<dyn FenceStore>,
    cache: Arc<MarkCache>,
    trust: Arc<StoreTrust>,
    metrics: Arc<Metrics>,
}

impl CheckedStore {
    pub fn new(
        inner: Arc<dyn FenceStore>,
        cache: Arc<MarkCache>,
        trust: Arc<StoreTrust>,
        metrics: Arc<Metrics>,
    ) -> CheckedStore {
        CheckedStore {
            inner,
            cache,
            trust,
            metrics,
        }
    }

    /// Times a backend call and counts its failure.
    async fn timed<T>(&self, op: &str, call: StoreFuture<'_, T>) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = call.await;
        self.record(op, started.elapsed(), result.is_err());
        result.inspect_err(|error| self.notice(error))
    }

    /// A backend that found, in the atomic step of a write, that the store is not the adopted
    /// one: nothing is trusted from here on.
    fn notice(&self, error: &StoreError) {
        if let StoreError::Untrusted { reason } = error {
            self.trust.distrust(reason.clone());
        }
    }

    /// Counts one backend call in the store metrics: its duration and, if it failed, the failure.
    fn record(&self, op: &str, took: std::time::Duration, failed: bool) {
        let backend = self.inner.backend();
        self.metrics.observe_store(backend, op, took);
        if failed {
            self.metrics
                .store_errors
                .with_label_values(&[backend])
                .inc();
        }
    }

    /// Checks an advance's answer against the mark seen before the call (`floor`) and raises the
    /// cache to the mark the answer implies.
    fn settle(
        &self,
        key: &str,
        token: u64,
        floor: Option<u64>,
        outcome: Advance,
    ) -> Result<(), StoreError> {
        let (before, after) = match outcome {
            Advance::Accepted { previous } => (previous, previous.map_or(token, |p| p.max(token))),
            Advance::Stale { current } => (Some(current), current),
        };
        if let Some(error) = self.regressed(key, before, floor) {
            return Err(error);
        }
        self.cache.raise(key, after);
        Ok(())
    }

    /// The answer `mark` for `key` is below `floor`, a mark seen before the call started.
    fn regressed(&self, key: &str, mark: Option<u64>, floor: Option<u64>) -> Option<StoreError> {
        let floor = floor?;
        if mark.is_some_and(|m| m >= floor) {
            return None;
        }
        let reason = format!(
            "the store answered mark {} for key {key}, below the mark {floor} this gateway already saw",
            mark.map_or_else(|| "none".to_owned(), |m| m.to_string())
        );
        self.trust.distrust(reason.clone());
        Some(StoreError::Untrusted { reason })
    }
}

impl FenceStore for CheckedStore {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(async move {
            if let Some(current) = self.cache.refuses(&key, token, compare) {
                return Ok(Advance::Stale { current });
            }
            self.trust.check()?;
            let floor = self.cache.get(&key);
            let outcome = self
                .timed("advance", self.inner.advance(&key, token, compare))
                .await?;
            self.settle(&key, token, floor, outcome)?;
            Ok(outcome)
        })
    }

    fn advance_and_begin(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
        begin: BeginRequest,
    ) -> Result<StoreFuture<'_, AdvancedAndBegun>, Box<BeginRequest>> {
        let call = self.inner.advance_and_begin(key, token, compare, begin)?;
        let key = key.to_owned();
        Ok(Box::pin(async move {
            if let Some(current) = self.cache.refuses(&key, token, compare) {
                // `call` is dropped unpolled: nothing was sent.
                return Ok(AdvancedAndBegun {
                    advance: Advance::Stale { current },
                    begun: None,
                });
            }
            self.trust.check()?;
            let floor = self.cache.get(&key);
            let answer = self.timed("advance_and_begin", call).await?;
            self.settle(&key, token, floor, answer.advance)?;
            Ok(answer)
        }))
    }

    fn settle_advance(
        &self,
        made: AdvanceMade<'_>,
        replaced: Result<Option<u64>, StoreError>,
    ) -> Result<Advance, StoreError> {
        let outcome = self.inner.settle_advance(made, replaced);
        self.record(made.op, made.took, outcome.is_err());
        let outcome = outcome.inspect_err(|error| self.notice(error))?;
        self.trust.check()?;
        self.settle(made.key, made.token, made.floor, outcome)?;
        Ok(outcome)
    }

    fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>> {
        let key = key.to_owned();
        Box::pin(async move {
            self.trust.check()?;
            let floor = self.cache.get(&key);
            if self.inner.exclusive() {
                // The only writer is this process and every advance raised the cache before it
                // returned: a cached mark is the mark (the ordering gate's re-check, per write).
                if let Some(mark) = floor {
                    return Ok(Some(mark));
                }
            }
            let mark = self.timed("current", self.inner.current(&key)).await?;
            if let Some(error) = self.regressed(&key, mark, floor) {
                return Err(error);
            }
            if let Some(mark) = mark {
                self.cache.raise(&key, mark);
            }
            Ok(mark)
        })
    }

    fn known_mark(&self, key: &str) -> Option<u64> {
        self.cache.get(key)
    }

    fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        self.inner.identity()
    }

    fn expect_identity(&self, id: &str) {
        self.inner.expect_identity(id);
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        self.inner.close()
    }

    fn exclusive(&self) -> bool {
        self.inner.exclusive()
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}
