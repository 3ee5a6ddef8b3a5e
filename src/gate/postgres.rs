//! The cross-replica gate on PostgreSQL: a session-level advisory lock on a 64-bit hash of the
//! key, held on a dedicated connection for the length of the forward. If the gateway dies, its
//! connection closes, the session ends and the gate opens by itself.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Postgres;

use crate::config::PostgresStoreConfig;
use crate::store::StoreError;

const BACKEND: &str = "postgres";
/// PostgreSQL's SQLSTATE for `lock_timeout` expiring.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// How long acquiring a gate connection may take before the request counts as failed.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct PostgresGate {
    pool: PgPool,
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

/// A key's shared gate, held: a session-level advisory lock on a pooled connection. Dropping it
/// unlocks in the background; a connection whose unlock fails, or that cannot be unlocked, is
/// closed instead of going back to the pool, and closing a session releases its locks.
pub struct SharedPass {
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
        let pool = PgPoolOptions::new()
            .max_connections(config.gate_connections.max(1))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_lazy_with(options);
        Ok(PostgresGate {
            pool,
            namespace: config.schema.clone(),
        })
    }

    /// Waits up to `wait` for the key's advisory lock.
    /// Waits at most `wait` for the key's lock. One round trip: the statement sets this wait as
    /// the session's `lock_timeout`, then takes the session-level lock (no transaction to begin
    /// and commit around it).
    pub async fn enter(&self, key: &str, wait: Duration) -> Result<SharedPass, SharedGateError> {
        let store_error = |source: sqlx::Error| {
            SharedGateError::Store(StoreError::Backend {
                backend: BACKEND,
                source: std::sync::Arc::new(source),
            })
        };
        let connection = self.pool.acquire().await.map_err(store_error)?;
        let mut pending = Unconfirmed(Some(connection));
        let millis = wait.as_millis().clamp(1, i32::MAX as u128);
        let lock = lock_id(&self.namespace, key);
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
            Ok(_) => Ok(SharedPass {
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
        self.pool.close().await;
    }
}

impl Drop for SharedPass {
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
