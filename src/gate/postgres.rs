//! The cross-replica gate on PostgreSQL: a transaction-scoped advisory lock on a 64-bit hash of
//! the key, held on a dedicated connection for the length of the forward. If the gateway dies,
//! its connection closes, the transaction ends and the gate opens by itself.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

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

/// An open transaction holding the key's advisory lock; committing (on drop) opens the gate.
pub struct SharedPass {
    transaction: Option<Transaction<'static, Postgres>>,
}

impl PostgresGate {
    /// A pool of its own (`gate_connections`): each forward in flight holds one connection.
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
    pub async fn enter(&self, key: &str, wait: Duration) -> Result<SharedPass, SharedGateError> {
        let store_error = |source: sqlx::Error| {
            SharedGateError::Store(StoreError::Backend {
                backend: BACKEND,
                source: std::sync::Arc::new(source),
            })
        };
        let mut transaction = self.pool.begin().await.map_err(store_error)?;
        let millis = wait.as_millis().clamp(1, i32::MAX as u128);
        sqlx::query(&format!("SET LOCAL lock_timeout = {millis}"))
            .execute(&mut *transaction)
            .await
            .map_err(store_error)?;
        let locked = sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(lock_id(&self.namespace, key))
            .execute(&mut *transaction)
            .await;
        match locked {
            Ok(_) => Ok(SharedPass {
                transaction: Some(transaction),
            }),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
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
        if let Some(transaction) = self.transaction.take() {
            // Ending the transaction releases the lock; a failed commit closes the connection,
            // which releases it too.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Err(e) = transaction.commit().await {
                        tracing::warn!(error = %e, "releasing a key's gate failed; its connection is dropped");
                    }
                });
            }
        }
    }
}

/// A stable 64-bit lock id for `key` (FNV-1a over the schema and the key, so two fencegate
/// deployments in one database do not share locks). A collision only serializes two keys.
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
