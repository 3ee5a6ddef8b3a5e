//! The fence store: durable high-water marks per resource key behind one trait (docs/design.md §4).
//! This module owns the `FenceStore` trait, its answers and errors, and the opening of the backend
//! the `[store]` table names; each backend is a directory of its own.
//!
//! - `embedded/`, `postgres/`, `redis/`, `etcd/`: the backends, each with its own schema and encoding.
//! - `plumbing/`: request queues and batching shared by the backends.
//! - `open.rs`: opening (and checking without connecting) the backend `[store]` names.
//! - `expected.rs`: the store identity a backend's writes are checked against.
//!
//! What the gateway keeps around a backend (cache, trust, adoption, metrics) is [`crate::guard`].
//! - `intents.rs`, `turns.rs`: the intent-record and key-turn traits the backends implement.

mod embedded;
#[cfg(feature = "etcd")]
mod etcd;
pub(crate) mod expected;
pub mod intents;
mod open;
mod plumbing;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod turns;

pub use embedded::EmbeddedStore;
#[cfg(feature = "etcd")]
pub use etcd::{EtcdStore, EtcdTurns};
pub use intents::{
    decide_begin, BeginRequest, Begun, IntentCensus, IntentRecord, IntentState, IntentStore,
    Resolution, StoredOutcome,
};
pub use open::{check_settings, open, Backend};
#[cfg(feature = "postgres")]
pub use postgres::{migrate as migrate_postgres, PostgresStore, PostgresTurns};
#[cfg(feature = "redis")]
pub use redis::RedisStore;
pub use turns::{Renewal, TakeTurn, TurnFreed, TurnStore, WAITER_RETRY};

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use crate::config::Compare;

/// The future every store operation returns (boxed so that backends sit behind `dyn FenceStore`).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The answer to a compare-and-advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// The token passed; the mark is now at least the token and that is durable.
    Accepted { previous: Option<u64> },
    /// The token is below the mark (or equal, under `strict`); nothing changed.
    Stale { current: u64 },
}

/// A backend that can begin an intent in the same write round as an advance (the embedded store:
/// one writer batch; PostgreSQL: one statement; Redis: one script call; etcd: one transaction), which saves an
/// idempotent write a round trip and a commit of its own. Only the backends that have such a
/// round implement it; [`Backend::combined`] says which.
pub trait AdvanceAndBegin: Send + Sync + 'static {
    /// [`FenceStore::advance`], and only when the token is accepted, `begin` on this backend's own
    /// intent records in the same round. The future does nothing until polled.
    fn advance_and_begin(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
        begin: BeginRequest,
    ) -> StoreFuture<'_, AdvancedAndBegun>;
}

/// The answer to [`AdvanceAndBegin::advance_and_begin`].
#[derive(Debug)]
pub struct AdvancedAndBegun {
    pub advance: Advance,
    /// The intent's answer, when the advance was accepted (`None` for a stale token: nothing
    /// was begun). A failed begin leaves the accepted advance in place, as two calls would.
    pub begun: Option<Result<Begun, StoreError>>,
}

/// What [`FenceStore::identity`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreIdentity {
    pub id: String,
    /// Whether this call created the record (the store had none).
    pub created: bool,
}

/// A fresh random store id.
pub fn new_store_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Durable high-water marks: the one trait every backend implements. Implementations must make an
/// `Accepted` advance durable before returning it (I2) and must never lower a mark (I3). What the
/// gateway adds around a backend — the cache, trust, metrics — is [`CheckedStore`](crate::guard::CheckedStore), not part of
/// this trait.
pub trait FenceStore: Send + Sync + 'static {
    /// Atomically compares `token` with `key`'s mark and raises the mark when the token passes.
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance>;
    /// The key's mark, or `None` for a key never advanced.
    fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>>;
    /// The store's identity record — a random id written the first time any gateway used the
    /// store — created when absent. A store that lost its data (a wiped Redis, a dropped table, a
    /// new file) comes back with a new id, which is how a gateway notices it (docs/design.md §4.4).
    fn identity(&self) -> StoreFuture<'_, StoreIdentity>;
    /// Records the identity of the store this gateway adopted: from then on every advance
    /// compares it in its own atomic step and fails with `Untrusted` on a store that lost it.
    fn expect_identity(&self, _id: &str) {}
    /// Finishes pending work and releases the store; later calls fail with `StoreError::Closed`.
    fn close(&self) -> StoreFuture<'_, ()>;
    /// Short backend name for logs and metrics.
    fn backend(&self) -> &'static str;
    /// Whether this process is the store's only writer (the embedded store holds an exclusive
    /// lock on its file). Every advance then passes through this process's `CheckedStore`, so
    /// its cache holds a key's exact mark, not only a lower bound.
    fn exclusive(&self) -> bool {
        false
    }
}

/// The comparison rule of docs/design.md §2.3, shared by every backend.
///
/// ```
/// use fencegate::config::Compare;
/// use fencegate::store::{decide, Advance};
///
/// assert_eq!(decide(Some(7), 7, Compare::Monotonic), Advance::Accepted { previous: Some(7) });
/// assert_eq!(decide(Some(7), 7, Compare::Strict), Advance::Stale { current: 7 });
/// ```
pub fn decide(mark: Option<u64>, token: u64, compare: Compare) -> Advance {
    match mark {
        None => Advance::Accepted { previous: None },
        Some(current) => {
            let passes = match compare {
                Compare::Monotonic => token >= current,
                Compare::Strict => token > current,
            };
            if passes {
                Advance::Accepted {
                    previous: Some(current),
                }
            } else {
                Advance::Stale { current }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("embedded store {path}: cannot open: {source}{hint}", hint = open_hint(.source))]
    Open {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error("embedded store {path}: cannot create its directory: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{backend} store: {source}")]
    Backend {
        backend: &'static str,
        /// Shared: one failed round trip answers every request of its batch.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    #[error("{backend} store: {detail}")]
    Setup {
        backend: &'static str,
        detail: String,
    },
    #[error("the store is closed")]
    Closed,
    #[error("the store is not trusted: {reason}")]
    Untrusted { reason: String },
}

impl StoreError {
    /// The same error again, for each caller of a batch that failed as one.
    pub fn again(&self) -> StoreError {
        match self {
            StoreError::Backend { backend, source } => StoreError::Backend {
                backend,
                source: Arc::clone(source),
            },
            StoreError::Setup { backend, detail } => StoreError::Setup {
                backend,
                detail: detail.clone(),
            },
            StoreError::Closed => StoreError::Closed,
            StoreError::Untrusted { reason } => StoreError::Untrusted {
                reason: reason.clone(),
            },
            other => StoreError::Setup {
                backend: "store",
                detail: other.to_string(),
            },
        }
    }
}

fn open_hint(source: &sqlx::Error) -> &'static str {
    if is_locked(source) {
        " (is another fencegate process using this file? the embedded store is single-node)"
    } else {
        ""
    }
}

/// Whether SQLite refused to open the file because another connection holds it.
fn is_locked(source: &sqlx::Error) -> bool {
    source.to_string().contains("locked")
}

impl StoreError {
    /// Whether the embedded store's file is held by another process (a running gateway).
    pub fn held_by_another_process(&self) -> bool {
        matches!(self, StoreError::Open { source, .. } if is_locked(source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_accepts_equal_and_strict_does_not() {
        assert_eq!(
            decide(None, 0, Compare::Strict),
            Advance::Accepted { previous: None }
        );
        assert_eq!(
            decide(Some(5), 5, Compare::Monotonic),
            Advance::Accepted { previous: Some(5) }
        );
        assert_eq!(
            decide(Some(5), 5, Compare::Strict),
            Advance::Stale { current: 5 }
        );
        assert_eq!(
            decide(Some(5), 4, Compare::Monotonic),
            Advance::Stale { current: 5 }
        );
        assert_eq!(
            decide(Some(5), 6, Compare::Strict),
            Advance::Accepted { previous: Some(5) }
        );
    }
}
