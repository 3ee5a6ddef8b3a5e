//! `Measured`: a backend with every call timed and every failure counted in the store metrics
//! (`fencegate_store_*`). The guard puts it between itself and the backend, so the guard itself
//! keeps only the cache and trust.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Compare;
use crate::metrics::Metrics;
use crate::store::{Advance, FenceStore, StoreError, StoreFuture, StoreIdentity};

pub struct Measured {
    inner: Arc<dyn FenceStore>,
    metrics: Arc<Metrics>,
}

impl Measured {
    pub fn new(inner: Arc<dyn FenceStore>, metrics: Arc<Metrics>) -> Measured {
        Measured { inner, metrics }
    }

    /// Times `call`, a call named `op` on this backend, and counts its failure.
    pub async fn time<T>(
        &self,
        op: &str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = call.await;
        self.record(op, started.elapsed(), result.is_err());
        result
    }

    /// Counts one call named `op` that took `took` (made on this backend by another component:
    /// the ordering gate's turn step).
    pub fn record(&self, op: &str, took: Duration, failed: bool) {
        let backend = self.inner.backend();
        self.metrics.observe_store(backend, op, took);
        if failed {
            self.metrics
                .store_errors
                .with_label_values(&[backend])
                .inc();
        }
    }
}

impl Measured {
    /// The backend's advance, counted under `op` (the ordering gate's advance after waiting for
    /// a key's turn is told apart from the fence's own).
    pub fn advance_as(
        &self,
        op: &'static str,
        key: &str,
        token: u64,
        compare: Compare,
    ) -> StoreFuture<'_, Advance> {
        let call = self.inner.advance(key, token, compare);
        Box::pin(self.time(op, call))
    }
}

impl FenceStore for Measured {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        self.advance_as("advance", key, token, compare)
    }

    fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>> {
        Box::pin(self.time("current", self.inner.current(key)))
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

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn exclusive(&self) -> bool {
        self.inner.exclusive()
    }
}
