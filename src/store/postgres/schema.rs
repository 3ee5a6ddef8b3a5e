//! fencegate's schema on PostgreSQL: created under an advisory lock, then brought up to date by
//! the migrations in `migrations/postgres/` (which sqlx checksums: they are never edited).

use sqlx::postgres::PgPool;

use super::BACKEND;
use crate::store::StoreError;

/// Advisory-lock key serializing schema creation among replicas ("fencegat" in ASCII).
const SCHEMA_LOCK_KEY: i64 = 0x6665_6e63_6567_6174;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// `CREATE SCHEMA IF NOT EXISTS`, under an advisory lock: replicas starting together would
/// otherwise race on the catalog's unique index. The schema is validated as a plain identifier
/// when the configuration loads.
pub(super) async fn create_schema(pool: &PgPool, schema: &str) -> Result<(), sqlx::Error> {
    let mut connection = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SCHEMA_LOCK_KEY)
        .execute(&mut *connection)
        .await?;
    let created = sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .execute(&mut *connection)
        .await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(SCHEMA_LOCK_KEY)
        .execute(&mut *connection)
        .await?;
    created.map(|_| ())
}

/// Applies the migrations not yet applied to `schema`; returns those it applied, as
/// `version description`, oldest first.
pub(super) async fn migrate_pool(pool: &PgPool, schema: &str) -> Result<Vec<String>, StoreError> {
    let setup = |e: &dyn std::fmt::Display| StoreError::Setup {
        backend: BACKEND,
        detail: format!("migrating schema {schema}: {e}"),
    };
    let before = applied_versions(pool).await.map_err(|e| setup(&e))?;
    MIGRATOR.run(pool).await.map_err(|e| setup(&e))?;
    Ok(MIGRATOR
        .iter()
        .filter(|m| !before.contains(&m.version))
        .map(|m| format!("{} {}", m.version, m.description))
        .collect())
}

/// The versions sqlx has recorded as applied (none before the first migration).
async fn applied_versions(pool: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(pool)
        .await
}
