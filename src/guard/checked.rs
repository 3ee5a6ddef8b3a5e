//! `CheckedStore`: what the gateway puts in front of every backend, as a concrete type rather
//! than another `FenceStore`. It refuses tokens below the lower-bound cache without a round trip,
//! keeps the cache up to date from the store's answers, and stops trusting a store whose answers
//! go below a mark already seen (a store that forgot). Timing is [`Measured`]'s job.

use std::sync::Arc;

use super::cache::MarkCache;
use super::measured::Measured;
use super::trust::StoreTrust;
use crate::config::Compare;
use crate::metrics::Metrics;
use crate::store::intents::BeginRequest;
use crate::store::{
    decide, Advance, AdvanceAndBegin, AdvancedAndBegun, FenceStore, StoreError, StoreFuture,
    StoreIdentity,
};

/// An advance made outside the store's own calls (on the network stores the ordering gate
/// advances in the step that takes the key's turn: one PostgreSQL statement, one Redis script, one
/// etcd transaction), for [`CheckedStore::settle_advance`].
#[derive(Debug, Clone, Copy)]
pub struct AdvanceMade<'a> {
    /// The call's name in the store metrics.
    pub op: &'static str,
    pub key: &'a str,
    pub token: u64,
    pub compare: Compare,
    /// [`CheckedStore::known_mark`] from before the call.
    pub floor: Option<u64>,
    pub took: std::time::Duration,
}

pub struct CheckedStore {
    inner: Measured,
    /// The backend's advance-and-begin round, where it has one.
    combined: Option<Arc<dyn AdvanceAndBegin>>,
    cache: Arc<MarkCache>,
    trust: Arc<StoreTrust>,
}

impl CheckedStore {
    pub fn new(
        backend: Arc<dyn FenceStore>,
        combined: Option<Arc<dyn AdvanceAndBegin>>,
        cache: Arc<MarkCache>,
        trust: Arc<StoreTrust>,
        metrics: Arc<Metrics>,
    ) -> CheckedStore {
        CheckedStore {
            inner: Measured::new(backend, metrics),
            combined,
            cache,
            trust,
        }
    }

    /// A guard of its own around `backend`, for a service that embeds the fence
    /// (the `embed` module): a cache of `cache_capacity` keys, trusted from the start (no adoption
    /// record), metrics in a registry of its own.
    pub fn standalone(backend: Arc<dyn FenceStore>, cache_capacity: usize) -> CheckedStore {
        CheckedStore::new(
            backend,
            None,
            Arc::new(MarkCache::new(cache_capacity)),
            Arc::new(StoreTrust::default()),
            Metrics::new(),
        )
    }

    /// Atomically compares `token` with `key`'s mark and raises it when the token passes: from
    /// the cache when it already refuses the token, else through the trusted backend.
    pub fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        self.advance_as("advance", key, token, compare)
    }

    /// The mark that already refuses `token` for `key`, if the cache knows one: what
    /// [`advance`](CheckedStore::advance) would answer as stale without a store call. Lets a
    /// caller answer such a token before it makes a store call's future at all.
    pub fn cached_refusal(&self, key: &str, token: u64, compare: Compare) -> Option<u64> {
        self.cache.refuses(key, token, compare)
    }

    /// [`advance`](CheckedStore::advance), counted in the store metrics under `op`.
    pub fn advance_as(
        &self,
        op: &'static str,
        key: &str,
        token: u64,
        compare: Compare,
    ) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(async move {
            if let Some(current) = self.cache.refuses(&key, token, compare) {
                return Ok(Advance::Stale { current });
            }
            self.trust.check()?;
            let floor = self.cache.get(&key);
            let answer = self.inner.advance_as(op, &key, token, compare).await;
            let outcome = self.noticed(answer)?;
            self.settle(&key, token, floor, outcome)?;
            Ok(outcome)
        })
    }

    /// [`advance`](CheckedStore::advance), and once the token is accepted `begin`, in one round of
    /// the backend's. `Err(begin)` hands the request back where the backend has no such round:
    /// the caller then advances and begins in turn.
    pub fn advance_and_begin(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
        begin: BeginRequest,
    ) -> Result<StoreFuture<'_, AdvancedAndBegun>, Box<BeginRequest>> {
        let Some(combined) = &self.combined else {
            return Err(Box::new(begin));
        };
        let call = combined.advance_and_begin(key, token, compare, begin);
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
            let answer = self.noticed(self.inner.time("advance_and_begin", call).await)?;
            self.settle(&key, token, floor, answer.advance)?;
            Ok(answer)
        }))
    }

    /// Checks and records, as its own advances are, an advance of `made.key` that another
    /// component made on the backend: `replaced` is the mark it replaced, or its failure.
    pub fn settle_advance(
        &self,
        made: AdvanceMade<'_>,
        replaced: Result<Option<u64>, StoreError>,
    ) -> Result<Advance, StoreError> {
        self.inner.record(made.op, made.took, replaced.is_err());
        let replaced = self.noticed(replaced)?;
        self.trust.check()?;
        let outcome = decide(replaced, made.token, made.compare);
        self.settle(made.key, made.token, made.floor, outcome)?;
        Ok(outcome)
    }

    /// The key's mark, or `None` for a key never advanced.
    pub fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>> {
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
            let mark = self.noticed(self.inner.current(&key).await)?;
            if let Some(error) = self.regressed(&key, mark, floor) {
                return Err(error);
            }
            if let Some(mark) = mark {
                self.cache.raise(&key, mark);
            }
            Ok(mark)
        })
    }

    /// A lower bound of the key's mark known without a round trip.
    pub fn known_mark(&self, key: &str) -> Option<u64> {
        self.cache.get(key)
    }

    pub fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        self.inner.identity()
    }

    pub fn close(&self) -> StoreFuture<'_, ()> {
        self.inner.close()
    }

    /// Short backend name for logs and metrics.
    pub fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    /// A backend that found, in the atomic step of a write, that the store is not the adopted
    /// one: nothing is trusted from here on.
    fn noticed<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Untrusted { reason }) = &result {
            self.trust.distrust(reason.clone());
        }
        result
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
