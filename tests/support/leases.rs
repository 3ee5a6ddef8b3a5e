//! A real lease table in PostgreSQL, as the reference text defines it: the lease counter is the
//! fencing token, raised by the acquiring statement itself. Also what a test that watches the
//! table needs: whether a lease has ended, and a lock taken whatever its state (a beacon).

use sqlx::PgPool;

/// Creates `{schema}.lock_leases`.
pub async fn create_table(pool: &PgPool, schema: &str) {
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .execute(pool)
        .await
        .expect("create schema");
    sqlx::query(&format!(
        "CREATE TABLE {schema}.lock_leases (
            lock_key   text        PRIMARY KEY,
            owner      text        NOT NULL,
            fence      bigint      NOT NULL,
            expires_at timestamptz NOT NULL
        )"
    ))
    .execute(pool)
    .await
    .expect("create lease table");
}

/// Acquire: the new fence if the lease was free (or expired), `None` if someone holds it.
pub async fn acquire(
    pool: &PgPool,
    schema: &str,
    key: &str,
    owner: &str,
    ttl_ms: u64,
) -> Option<u64> {
    let row: Option<(i64,)> = sqlx::query_as(&format!(
        "INSERT INTO {schema}.lock_leases (lock_key, owner, fence, expires_at)
         VALUES ($1, $2, 1, now() + make_interval(secs => $3 / 1000.0))
         ON CONFLICT (lock_key) DO UPDATE
            SET owner      = EXCLUDED.owner,
                fence      = lock_leases.fence + 1,
                expires_at = EXCLUDED.expires_at
          WHERE lock_leases.expires_at <= now()
         RETURNING fence"
    ))
    .bind(key)
    .bind(owner)
    .bind(ttl_ms as f64)
    .fetch_optional(pool)
    .await
    .expect("acquire lease");
    row.map(|(fence,)| fence as u64)
}

/// Renew: whether the lease is still ours (zero rows means it expired or was taken).
pub async fn renew(pool: &PgPool, schema: &str, key: &str, fence: u64, ttl_ms: u64) -> bool {
    sqlx::query(&format!(
        "UPDATE {schema}.lock_leases
            SET expires_at = now() + make_interval(secs => $3 / 1000.0)
          WHERE lock_key = $1 AND fence = $2 AND expires_at > now()"
    ))
    .bind(key)
    .bind(fence as i64)
    .bind(ttl_ms as f64)
    .execute(pool)
    .await
    .expect("renew lease")
    .rows_affected()
        == 1
}

/// Release: expire the lease but keep the row, so the counter never restarts.
pub async fn release(pool: &PgPool, schema: &str, key: &str, fence: u64) {
    sqlx::query(&format!(
        "UPDATE {schema}.lock_leases SET expires_at = now() WHERE lock_key = $1 AND fence = $2"
    ))
    .bind(key)
    .bind(fence as i64)
    .execute(pool)
    .await
    .expect("release lease");
}

/// Takes `key` whatever its state (held or not), raising its fence: a change to the table made
/// now, for a test to see when a gateway following the table has read it. The new fence.
pub async fn seize(pool: &PgPool, schema: &str, key: &str, owner: &str, ttl_ms: u64) -> u64 {
    let (fence,): (i64,) = sqlx::query_as(&format!(
        "INSERT INTO {schema}.lock_leases (lock_key, owner, fence, expires_at)
         VALUES ($1, $2, 1, now() + make_interval(secs => $3 / 1000.0))
         ON CONFLICT (lock_key) DO UPDATE
            SET owner      = EXCLUDED.owner,
                fence      = lock_leases.fence + 1,
                expires_at = EXCLUDED.expires_at
         RETURNING fence"
    ))
    .bind(key)
    .bind(owner)
    .bind(ttl_ms as f64)
    .fetch_one(pool)
    .await
    .expect("seize lease");
    fence as u64
}

/// Whether the lease `fence` of `key` has ended by the database's clock: expired, released, or
/// taken over since.
pub async fn ended(pool: &PgPool, schema: &str, key: &str, fence: u64) -> bool {
    let (ended,): (bool,) = sqlx::query_as(&format!(
        "SELECT fence <> $2 OR expires_at <= now() FROM {schema}.lock_leases WHERE lock_key = $1"
    ))
    .bind(key)
    .bind(fence as i64)
    .fetch_one(pool)
    .await
    .expect("read lease");
    ended
}
