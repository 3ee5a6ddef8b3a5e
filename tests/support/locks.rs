//! Lock clients as the lock services' own recipes take locks, for the authority tests: an etcd
//! lock (a key `<lock>/<lease hex>` under a lease; its create revision is the token) and the
//! PostgreSQL lease table of docs/getting-tokens.md (its `fence` is the token).

use std::time::Duration;

use base64::Engine as _;
use sqlx::Connection as _;

use super::etcd::call;
use super::postgres::TEST_POSTGRES_URL;

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
}

/// A contender's key in an etcd lock, under its own lease.
#[derive(Debug, Clone)]
pub struct EtcdContender {
    pub lease: i64,
    pub key: String,
    /// The key's create revision: the token once the contender holds the lock.
    pub token: u64,
}

/// Puts a contender for `lock` under a new lease of `ttl` seconds (it holds the lock when no
/// older contender is left).
pub async fn etcd_contend(lock: &str, ttl: u64) -> EtcdContender {
    let granted = call(
        "/v3/lease/grant",
        serde_json::json!({"TTL": ttl.to_string()}),
    )
    .await;
    let lease: i64 = granted["ID"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("a lease id");
    let key = format!("{lock}/{lease:x}");
    let answer = call(
        "/v3/kv/txn",
        serde_json::json!({
            "compare": [{"key": b64(&key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(&key), "value": b64("holder"), "lease": lease.to_string()}}],
        }),
    )
    .await;
    assert_eq!(answer["succeeded"], true, "a fresh contender key: {answer}");
    let token = answer["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("the put's revision");
    EtcdContender { lease, key, token }
}

/// Ends a lease at once (its keys are deleted), as an unlock or an expiry would.
pub async fn etcd_revoke(lease: i64) {
    call(
        "/v3/lease/revoke",
        serde_json::json!({"ID": lease.to_string()}),
    )
    .await;
}

/// Renews a lease once.
pub async fn etcd_keep_alive(lease: i64) {
    call(
        "/v3/lease/keepalive",
        serde_json::json!({"ID": lease.to_string()}),
    )
    .await;
}

/// A PostgreSQL lease table in a schema of its own; dropped by `drop`.
pub struct LeaseTable {
    pub schema: String,
    pub table: String,
}

impl LeaseTable {
    pub async fn create() -> LeaseTable {
        let schema = super::postgres::unique_schema();
        let table = format!("{schema}.lock_leases");
        let mut connection = connect().await;
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&mut connection)
            .await
            .expect("create schema");
        sqlx::query(&format!(
            "CREATE TABLE {table} (lock_key text PRIMARY KEY, owner text NOT NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL)"
        ))
        .execute(&mut connection)
        .await
        .expect("create the lease table");
        LeaseTable { schema, table }
    }

    /// Takes `lock` for `ttl` if it is free or expired: the new fence, else `None`.
    pub async fn acquire(&self, lock: &str, owner: &str, ttl: Duration) -> Option<u64> {
        let mut connection = connect().await;
        let fence: Option<i64> = sqlx::query_scalar(&format!(
            "INSERT INTO {t} (lock_key, owner, fence, expires_at) VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond') \
             ON CONFLICT (lock_key) DO UPDATE SET owner = EXCLUDED.owner, fence = {t}.fence + 1, expires_at = EXCLUDED.expires_at \
             WHERE {t}.expires_at <= now() RETURNING fence",
            t = self.table
        ))
        .bind(lock)
        .bind(owner)
        .bind(i64::try_from(ttl.as_millis()).expect("a short ttl"))
        .fetch_optional(&mut connection)
        .await
        .expect("acquire");
        fence.map(|f| u64::try_from(f).expect("a positive fence"))
    }

    /// Ends the lease now, keeping the row (so the fence never restarts).
    pub async fn release(&self, lock: &str, fence: u64) {
        let mut connection = connect().await;
        sqlx::query(&format!(
            "UPDATE {} SET expires_at = now() WHERE lock_key = $1 AND fence = $2",
            self.table
        ))
        .bind(lock)
        .bind(i64::try_from(fence).expect("fence"))
        .execute(&mut connection)
        .await
        .expect("release");
    }

    pub async fn drop(self) {
        super::postgres::drop_schema(&self.schema).await;
    }
}

async fn connect() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(TEST_POSTGRES_URL)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {TEST_POSTGRES_URL} is required: {e}"))
}
