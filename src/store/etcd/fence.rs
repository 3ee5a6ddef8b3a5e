//! `FenceStore` for `EtcdStore`: advances go to the calling thread's batcher, which sends each
//! batch as one transaction ([`super::advance`]); reads and the identity go straight to etcd.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::advance::{run_batch, AdvanceRequest};
use super::error::{unexpected, BACKEND};
use super::identity::{cluster_of, identity};
use super::keys::decode_mark;
use super::EtcdStore;
use crate::config::Compare;
use crate::store::plumbing::batches::{run_batches, QUEUE};
use crate::store::{Advance, FenceStore, StoreError, StoreFuture, StoreIdentity};

impl EtcdStore {
    async fn advance_batched(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
    ) -> Result<Advance, StoreError> {
        self.check_open()?;
        let batcher = self.batchers.queue(|| {
            let (batcher, requests) = mpsc::channel(QUEUE);
            let (client, keys, expected) = (
                Arc::clone(&self.client),
                self.keys.clone(),
                Arc::clone(&self.expected),
            );
            tokio::spawn(run_batches(
                requests,
                self.max_batch,
                super::BATCHES_IN_FLIGHT,
                move |batch| {
                    let (client, keys) = (Arc::clone(&client), keys.clone());
                    let expected = expected.get();
                    async move { run_batch(&client, &keys, batch, expected.as_deref()).await }
                },
            ));
            batcher
        })?;
        let (reply, answer) = oneshot::channel();
        batcher
            .send(AdvanceRequest {
                key: key.to_owned(),
                token,
                compare,
                reply,
            })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

impl FenceStore for EtcdStore {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(async move { self.advance_batched(&key, token, compare).await })
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
            Ok(())
        })
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}
