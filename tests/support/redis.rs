//! Redis helpers for tests: the machine's server, a unique key prefix per test, and cleanup.

use std::future::Future;

use redis::AsyncCommands as _;

/// The Redis every test talks to.
pub const REDIS_ADDR: &str = "127.0.0.1:6379";

pub fn redis_url() -> String {
    format!("redis://{REDIS_ADDR}")
}

/// A key prefix no other test uses.
pub fn unique_prefix() -> String {
    format!("fencegate-test:{}:", uuid::Uuid::new_v4())
}

/// A direct connection for setting up and cleaning up keys.
pub async fn direct() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis_url()).expect("valid url");
    match client.get_multiplexed_async_connection().await {
        Ok(connection) => connection,
        Err(e) => panic!(
            "these tests need a Redis server at {REDIS_ADDR} (scripts/ensure-services.sh starts one): {e}"
        ),
    }
}

/// Runs `test` with a fresh key prefix, then deletes every key under it, even when `test` fails.
pub async fn with_prefix<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let prefix = unique_prefix();
    let outcome = tokio::spawn(test(prefix.clone())).await;
    delete_keys(&prefix).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Every key under `prefix`, by `SCAN` (the shared server is never blocked by `KEYS`).
pub async fn keys_under(prefix: &str) -> Vec<String> {
    let mut connection = direct().await;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut connection)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Deletes every key under `prefix`.
pub async fn delete_keys(prefix: &str) {
    let keys = keys_under(prefix).await;
    let mut connection = direct().await;
    for chunk in keys.chunks(500) {
        let _: () = connection.del(chunk).await.expect("DEL");
    }
}
