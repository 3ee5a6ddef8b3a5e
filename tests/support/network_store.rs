//! A network store for one test: PostgreSQL under a schema of the test's own, or Redis or etcd
//! under a key prefix of its own, its server's address, and the cleanup that runs even when the test fails.

use std::future::Future;

use super::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};

/// The machine's PostgreSQL, as a `host:port` a relay can point at.
pub const POSTGRES_ADDR: &str = "127.0.0.1:5432";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Redis,
    Etcd,
}

impl Backend {
    /// The `[store]` table reaching the server at `addr` (the server, or a relay in front of it)
    /// under `namespace` (a schema or key prefix), with a small pool.
    pub fn store_toml(self, addr: &str, namespace: &str) -> String {
        match self {
            Backend::Postgres => format!(
                "[store]\nbackend = \"postgres\"\nurl = \"postgres://postgres@{addr}/test\"\nschema = \"{namespace}\"\nmax_connections = 2\n"
            ),
            Backend::Redis => format!(
                "[store]\nbackend = \"redis\"\nurl = \"redis://{addr}\"\nkey_prefix = \"{namespace}\"\n"
            ),
            Backend::Etcd => format!(
                "[store]\nbackend = \"etcd\"\nendpoints = [\"http://{addr}\"]\nkey_prefix = \"{namespace}\"\n"
            ),
        }
    }

    /// The server's `host:port`.
    pub fn addr(self) -> &'static str {
        match self {
            Backend::Postgres => POSTGRES_ADDR,
            Backend::Redis => super::redis::REDIS_ADDR,
            Backend::Etcd => super::etcd::ETCD_ADDR,
        }
    }
}

/// A schema or key prefix no other test uses, after checking the server answers (a test fails,
/// never skips, without it).
pub async fn fresh_namespace(backend: Backend) -> String {
    match backend {
        Backend::Postgres => {
            if let Err(e) =
                <sqlx::PgConnection as sqlx::Connection>::connect(TEST_POSTGRES_URL).await
            {
                panic!("this test needs PostgreSQL at {TEST_POSTGRES_URL}: {e}");
            }
            unique_schema()
        }
        Backend::Redis => {
            drop(super::redis::direct().await);
            super::redis::unique_prefix()
        }
        Backend::Etcd => {
            super::etcd::call("/v3/kv/range", serde_json::json!({"key": "cHJvYmU="})).await;
            super::etcd::unique_prefix()
        }
    }
}

/// Removes what a test wrote under `namespace`.
pub async fn remove_namespace(backend: Backend, namespace: &str) {
    match backend {
        Backend::Postgres => drop_schema(namespace).await,
        Backend::Redis => super::redis::delete_keys(namespace).await,
        Backend::Etcd => super::etcd::delete_keys(namespace).await,
    }
}

/// Runs `test` with a fresh schema or key prefix, then removes it, even when `test` fails. Fails
/// (never skips) when the server cannot be reached.
pub async fn with_namespace<F, Fut, T>(backend: Backend, test: F) -> T
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let namespace = fresh_namespace(backend).await;
    let outcome = tokio::spawn(test(namespace.clone())).await;
    remove_namespace(backend, &namespace).await;
    outcome.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}
