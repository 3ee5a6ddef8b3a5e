//! `FenceStore` for `EtcdStore`: advances go to the calling thread's batcher, which sends each
//! batch as one transaction ([`super::advance`]); reads and the identity go straight to etcd.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::advance::{run_batch, AdvanceRequest, Advanced, BeginInBatch};
use super::error::{unexpected, BACKEND};
use super::identity::{cluster_of, identity};
use super::keys::decode_mark;
use super::outcomes::{run_outcomes, OutcomeRequest};
use super::EtcdStore;
use crate::config::Compare;
use crate::etcd::wire::RequestOp;
use crate::store::plumbing::batches::call_batched;
use crate::store::{Advance, FenceStore, StoreError, StoreFuture, StoreIdentity};

impl EtcdStore {
    /// An advance, and `begin` in its transaction where it can go there, by the calling thread's
    /// batcher.
    pub(super) async fn advance_batched(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
        begin: Option<BeginInBatch>,
    ) -> Result<Advanced, StoreError> {
        self.check_open()?;
        let start = || {
            let (client, keys, expected) = (
                Arc::clone(&self.client),
                self.keys.clone(),
                Arc::clone(&self.expected),
            );
            move |batch| {
                let (client, keys) = (Arc::clone(&client), keys.clone());
                let expected = expected.get();
                async move { run_batch(&client, &keys, batch, expected.as_deref()).await }
            }
        };
        let limits = (self.max_batch, super::BATCHES_IN_FLIGHT);
        call_batched(&self.batchers, limits, start, |reply| AdvanceRequest {
            key: key.to_owned(),
            token,
            compare,
            begin,
            reply,
        })
        .await
    }

    /// Swaps an intent's record by `swap` (see [`super::outcomes`]) in the calling thread's
    /// outcome batch; `false` when the swap did not run.
    pub(super) async fn outcome_batched(
        &self,
        intent_key: &str,
        swap: RequestOp,
    ) -> Result<bool, StoreError> {
        self.check_open()?;
        let start = || {
            let client = Arc::clone(&self.client);
            move |batch| {
                let client = Arc::clone(&client);
                async move { run_outcomes(&client, batch).await }
            }
        };
        let limits = (self.max_batch, super::BATCHES_IN_FLIGHT);
        call_batched(&self.outcome_batchers, limits, start, |reply| {
            OutcomeRequest {
                intent_key: intent_key.to_owned(),
                swap,
                reply,
            }
        })
        .await
    }
}

impl FenceStore for EtcdStore {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(async move {
            let advanced = self.advance_batched(&key, token, compare, None).await?;
            Ok(advanced.advance)
        })
    }

    fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>> {
        let key = self.keys.mark(key);
        Box::pin(async move {
            match self.read(&key).await? {
                None => Ok(None),
                Some(kv) => decode_mark(&kv.value.0).map(Some).map_err(unexpected),
            }
        })
    }

    fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        Box::pin(async move {
            self.check_open()?;
            identity(&self.client, &self.keys).await
        })
    }

    fn expect_identity(&self, id: &str) {
        self.expected.set(id);
        if let Some(cluster) = cluster_of(id) {
            self.client.expect_cluster(cluster);
        }
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.closed.store(true, Ordering::Release);
            // A batcher whose queue is dropped ends once it has answered what was queued.
            drop(self.batchers.close());
            drop(self.outcome_batchers.close());
            Ok(())
        })
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}
