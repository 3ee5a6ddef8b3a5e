//! PostgreSQL helpers for tests: the machine's server, a unique schema per test, and cleanup.

use sqlx::Connection as _;

/// The local server the tests use (trust auth), plain on purpose: the server offers TLS (Debian
/// turns `ssl` on), and sqlx's default `sslmode=prefer` would take it, adding a handshake to every
/// connection of every test. TLS to the store is tested on its own, in tests/stores/tls.rs.
pub const TEST_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

/// A schema name no other test uses.
pub fn unique_schema() -> String {
    format!("fg_test_{}", uuid::Uuid::new_v4().simple())
}

/// A connection to the local server; a test fails, never skips, without one.
pub async fn connect() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(TEST_POSTGRES_URL)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {TEST_POSTGRES_URL} is required: {e}"))
}

/// Drops a test schema and everything in it.
pub async fn drop_schema(schema: &str) {
    let mut connection = connect().await;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&mut connection)
        .await
        .expect("drop test schema");
}
