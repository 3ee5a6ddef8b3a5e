//! The cross-replica gate on PostgreSQL: a session-level advisory lock on a 64-bit hash of the
//! key, held for the length of the forward. A free key is taken by a lock-holder session (one per
//! serving thread, `holders.rs`), in batches (`lock_holder.rs`), which may also advance its mark
//! in the same statement; a key another replica holds is waited for on a dedicated connection. If
//! the gateway dies, its connections close, the sessions end and the gate opens by itself.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Postgres;

use super::holders::Holders;
use super::lock_holder::HeldLock;
use crate::config::PostgresStoreConfig;
use crate::store::StoreError;

const BACKEND: &str = "postgres";
/// PostgreSQL's SQLSTATE for `lock_timeout` expiring.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// How long acquiring a gate connection may take before the request counts as failed.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct PostgresGate {
    /// Dedicated connections, for waiting on a key another session holds.
    pool: PgPool,
    holders: Holders,
    namespace: String,
}

/// Why the shared gate was not entered.
#[derive(Debug, thiserror::Error)]
pub enum SharedGateError {
    #[error("the key's gate stayed closed for {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A key's shared gate, held: by a lock-holder session, or (after waiting for another replica)
/// on a dedicated pooled connection. Dropping it releases the lock in the background.
pub enum SharedPass {
    /// Taken in a lock-holder batch, with the key's mark as found under the lock (before the
    /// entry's own advance, for [`PostgresGate::try_enter_and_advance`]).
    Batched {
        lock: HeldLock,
        mark: Option<u64>,
    },
    Dedicated(DedicatedLock),
}

impl SharedPass {
    /// The key's mark as read once the lock was held (`Some(None)`: no mark), when the pass came
    /// with one; `None` means the caller must read the mark itself.
    pub fn mark_under_lock(&self) -> Option<Option<u64>> {
        match self {
            SharedPass::Batched { mark, .. } => Some(*mark),
            SharedPass::Dedicated(_) => None,
        }
    }
}

/// A session-level advisory lock on a pooled connection. Dropping it unlocks in the background;
/// a connection whose unlock fails, or that cannot be unlocked, is closed instead of going back
/// to the pool, and closing a session releases its locks.
pub struct DedicatedLock {
    connection: Option<PoolConnection<Postgres>>,
    lock: i64,
}

/// A connection whose lock statement has not answered yet. If the wait is abandoned (the request
/// went away), the statement may still take the lock on the server: such a connection is closed,
/// never pooled, so no pooled session can hold a lock nobody will release.
struct Unconfirmed(Option<PoolConnection<Postgres>>);

impl Drop for Unconfirmed {
    fn drop(&mut self) {
        if let Some(mut connection) = self.0.take() {
            connection.close_on_drop();
        }
    }
}

impl PostgresGate {
    pub async fn open(config: &PostgresStoreConfig) -> Result<PostgresGate, StoreError> {
        let setup = |detail: String| StoreError::Setup {
            backend: BACKEND,
            detail,
        };
        let options: sqlx::postgres::PgConnectOptions = config
            .url
            .parse()
            .map_err(|e| setup(format!("gate: not a PostgreSQL URL: {e}")))?;
        // The holder sessions call fencegate's function and read its table unqualified, and the
        // function's read must see commits made after its statement began (READ COMMITTED; the
        // space is escaped for the startup packet's option string, which sqlx passes as is).
        let holder_options = options.clone().options([
            ("search_path", config.schema.as_str()),
            ("default_transaction_isolation", "read\\ committed"),
        ]);
        let holders = Holders::new(holder_options);
        let pool = PgPoolOptions::new()
            .max_connections(config.gate_connections.max(1))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_lazy_with(options);
        Ok(PostgresGate {
            pool,
            holders,
            namespace: config.schema.clone(),
        })
    }

    /// Waits at most `wait` for the key's lock: first a try in the key's lock-holder session's
    /// next batch, then, if another session holds the key, a wait on a dedicated connection.
    pub async fn enter(&self, key: &str, wait: Duration) -> Result<SharedPass, SharedGateError> {
        let started = std::time::Instant::now();
        let lock = lock_id(&self.namespace, key);
        let holder = self.holders.for_lock(lock)?;
        match tokio::time::timeout(wait, holder.try_lock(lock, key, None)).await {
            Ok(Ok(Some(taken))) => {
                return Ok(SharedPass::Batched {
                    lock: taken.lock,
                    mark: taken.mark,
                })
            }
            Ok(Ok(None)) => {}
            Ok(Err(source)) => return Err(SharedGateError::Store(source)),
            Err(_) => return Err(SharedGateError::Timeout(wait)),
        }
        let left = wait.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(SharedGateError::Timeout(wait));
        }
        self.wait_dedicated(lock, left)
            .await
            .map(SharedPass::Dedicated)
            .map_err(|e| match e {
                SharedGateError::Timeout(_) => SharedGateError::Timeout(wait),
                other => other,
            })
    }

    /// Takes the key's lock in its lock-holder session's next batch, if no other session holds
    /// it, and in the same statement compare-and-advances the key's mark to `token`, durable when
    /// this returns: the pass and the mark the advance replaced (`None`: the key had none).
    /// `None`: the key is held elsewhere and nothing was advanced; [`wait_for`](Self::wait_for)
    /// waits for it.
    pub async fn try_enter_and_advance(
        &self,
        key: &str,
        token: u64,
    ) -> Result<Option<(SharedPass, Option<u64>)>, StoreError> {
        let lock = lock_id(&self.namespace, key);
        let holder = self.holders.for_lock(lock)?;
        let taken = holder.try_lock(lock, key, Some(token)).await?;
        Ok(taken.map(|taken| {
            let pass = SharedPass::Batched {
                lock: taken.lock,
                mark: taken.mark,
            };
            (pass, taken.mark)
        }))
    }

    /// Waits at most `wait` for the key's lock on a dedicated connection (for a key another
    /// session holds).
    pub async fn wait_for(&self, key: &str, wait: Duration) -> Result<SharedPass, SharedGateError> {
        self.wait_dedicated(lock_id(&self.namespace, key), wait)
            .await
            .map(SharedPass::Dedicated)
    }

    /// Waits at most `wait` for the lock on a dedicated connection. One round trip: the statement
    /// sets this wait as the session's `lock_timeout`, then takes the session-level lock (no
    /// transaction to begin and commit around it).
    async fn wait_dedicated(
        &self,
        lock: i64,
        wait: Duration,
    ) -> Result<DedicatedLock, SharedGateError> {
        let store_error = |source: sqlx::Error| {
            SharedGateError::Store(StoreError::Backend {
                backend: BACKEND,
                source: std::sync::Arc::new(source),
            })
        };
        let connection = self.pool.acquire().await.map_err(store_error)?;
        let mut pending = Unconfirmed(Some(connection));
        let millis = wait.as_millis().clamp(1, i32::MAX as u128);
        let Some(connection) = pending.0.as_mut() else {
            return Err(SharedGateError::Timeout(wait));
        };
        // The CTE is scanned first, so the timeout is in force before the lock waits.
        let locked = sqlx::query(
            "WITH wait AS (SELECT set_config('lock_timeout', $1, false)) \
             SELECT pg_advisory_lock($2) FROM wait",
        )
        .bind(format!("{millis}ms"))
        .bind(lock)
        .execute(&mut **connection)
        .await;
        match locked {
            Ok(_) => Ok(DedicatedLock {
                connection: pending.0.take(),
                lock,
            }),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                // The statement failed cleanly: the connection holds nothing and can be pooled.
                drop(pending.0.take());
                Err(SharedGateError::Timeout(wait))
            }
            Err(e) => Err(store_error(e)),
        }
    }

    pub async fn close(&self) {
        self.holders.close();
        self.pool.close().await;
    }
}

impl Drop for DedicatedLock {
    fn drop(&mut self) {
        let Some(mut connection) = self.connection.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            connection.close_on_drop();
            return;
        };
        let lock = self.lock;
        runtime.spawn(async move {
            let unlocked: Result<bool, sqlx::Error> =
                sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                    .bind(lock)
                    .fetch_one(&mut *connection)
                    .await;
            if !matches!(unlocked, Ok(true)) {
                tracing::warn!(result = ?unlocked, "releasing a key's gate failed; its connection is closed");
                connection.close_on_drop();
            }
        });
    }
}

fn lock_id(namespace: &str, key: &str) -> i64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in namespace.bytes().chain([0]).chain(key.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::lock_id;

    #[test]
    fn lock_ids_are_stable_and_namespaced() {
        assert_eq!(
            lock_id("fencegate", "invoice:1"),
            lock_id("fencegate", "invoice:1")
        );
        assert_ne!(
            lock_id("fencegate", "invoice:1"),
            lock_id("fencegate", "invoice:2")
        );
        assert_ne!(lock_id("a", "invoice:1"), lock_id("b", "invoice:1"));
        // FNV-1a of one zero byte is 0xaf63bd4c8601b7df: the function is the published one.
        assert_eq!(
            lock_id("", ""),
            i64::from_ne_bytes(0xaf63_bd4c_8601_b7df_u64.to_ne_bytes())
        );
    }
}
