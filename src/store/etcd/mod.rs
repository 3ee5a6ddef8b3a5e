//! The etcd backend: marks, intents and key turns in an etcd cluster, where an accepted advance
//! is committed by a quorum before it is answered. Every key lives under `key_prefix`
//! (`keys.rs`); the cluster is reached through its v3 HTTP/JSON gateway (`crate::etcd`).
//!
//! `advance.rs`: the batched compare-and-advance transaction; `fence.rs`: the `FenceStore` impl
//! and the per-thread batchers; `identity.rs`: the store identity record; `intents.rs`: intent
//! records by compare-and-swap on their revision; `outcomes.rs`: the batched outcomes of intents
//! begun fresh; `turns.rs`: key turns under etcd leases, which `leases.rs` shares between the
//! turns of about a second, taken in batches by `takes.rs` and given back in batches by
//! `releases.rs`.

mod advance;
mod error;
mod fence;
mod identity;
mod intents;
mod keys;
mod leases;
mod outcomes;
mod releases;
mod takes;
mod turns;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::config::EtcdStoreConfig;
use crate::etcd::client::{self, EtcdClient};
use crate::etcd::wire;
use crate::store::expected::ExpectedIdentity;
use crate::store::plumbing::per_thread::PerThread;
use crate::store::StoreError;
use advance::AdvanceRequest;
use error::{wrap, BACKEND};
use keys::Keys;
use outcomes::{OutcomeRequest, OwnBegins};
pub use turns::EtcdTurns;

/// Checks the endpoints and TLS settings as opening the store would, without connecting
/// (`check-config`).
pub fn check_tls(config: &EtcdStoreConfig) -> Result<(), crate::tls::StoreTlsError> {
    client::check_tls(config)
}

/// Advance batches each serving thread has in flight at once: etcd pipelines concurrent
/// transactions through one raft round, so a second batch fills while the first commits.
const BATCHES_IN_FLIGHT: usize = 2;

/// etcd's own limit (`checkTxnRequest` in its v3rpc): a transaction's compare, success and
/// failure lists each hold at most `max_ops`, and a nested transaction only what its parent's
/// longest list left.
#[cfg(test)]
fn within_max_txn_ops(txn: &wire::TxnRequest, max_ops: usize) -> bool {
    let ops = txn
        .compare
        .len()
        .max(txn.success.len())
        .max(txn.failure.len());
    ops <= max_ops
        && txn.success.iter().chain(&txn.failure).all(|op| match op {
            wire::RequestOp::Txn(nested) => within_max_txn_ops(nested, max_ops - ops),
            _ => true,
        })
}

/// Handle to one etcd cluster; cheap to share behind an `Arc`.
pub struct EtcdStore {
    client: Arc<EtcdClient>,
    keys: Keys,
    batchers: PerThread<mpsc::Sender<AdvanceRequest>>,
    outcome_batchers: PerThread<mpsc::Sender<OutcomeRequest>>,
    own_begins: OwnBegins,
    max_batch: usize,
    expected: Arc<ExpectedIdentity>,
    closed: AtomicBool,
}

impl EtcdStore {
    /// Builds the client and checks that the cluster answers (by reading the store identity's
    /// key); nothing is written.
    pub async fn open(config: &EtcdStoreConfig) -> Result<EtcdStore, StoreError> {
        let setup = |detail: String| StoreError::Setup {
            backend: BACKEND,
            detail,
        };
        let endpoints = config.endpoints.join(", ");
        let password = crate::config::secret::read_allowing_empty(
            "password",
            config.password_env.as_deref(),
            config.password_file.as_deref(),
        )
        .map_err(|e| {
            let field = if config.password_file.is_some() {
                "password_file"
            } else {
                "password_env"
            };
            setup(format!("store.{field}: {e}"))
        })?;
        let client = EtcdClient::new(config, password)
            .map_err(|e| setup(format!("store.{}: {}", e.field, e.message)))?;
        let keys = Keys::new(&config.key_prefix);
        let probe = wire::RangeRequest {
            key: keys.store_id().into(),
            ..Default::default()
        };
        let _: wire::RangeResponse = client
            .call("/v3/kv/range", &probe)
            .await
            .map_err(|e| setup(format!("cannot reach etcd at {endpoints}: {e}")))?;
        Ok(EtcdStore {
            client: Arc::new(client),
            keys,
            batchers: PerThread::new(),
            outcome_batchers: PerThread::new(),
            own_begins: OwnBegins::default(),
            max_batch: config
                .max_batch
                .clamp(1, crate::config::DEFAULT_ETCD_MAX_BATCH),
            expected: Arc::new(ExpectedIdentity::default()),
            closed: AtomicBool::new(false),
        })
    }

    /// The key turns of this store (for the ordering gate), taken under the name `holder`.
    pub fn turns(&self, holder: &str) -> EtcdTurns {
        EtcdTurns::new(
            Arc::clone(&self.client),
            self.keys.clone(),
            holder,
            Arc::clone(&self.expected),
            self.max_batch,
        )
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    /// A read of one key: its value and revision, or `None`.
    async fn read(&self, key: &str) -> Result<Option<wire::KeyValue>, StoreError> {
        self.check_open()?;
        let request = wire::RangeRequest {
            key: key.into(),
            ..Default::default()
        };
        let answer: wire::RangeResponse = self
            .client
            .call("/v3/kv/range", &request)
            .await
            .map_err(wrap)?;
        Ok(answer.kvs.into_iter().next())
    }
}
