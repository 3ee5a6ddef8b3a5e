//! The Redis store keeps the `FenceStore` contract (`tests/support/contract.rs`) against the Redis
//! at 127.0.0.1:6379, compares u64 tokens exactly in its Lua script, and survives losing its
//! connection. Each test writes under its own key prefix and deletes its keys afterwards.
//!
//! These tests need a running Redis; without one they fail, they do not skip.

mod support;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use fencegate::config::{Compare, RedisStoreConfig, DEFAULT_CACHE_CAPACITY, DEFAULT_MAX_BATCH};
use fencegate::store::{decide, Advance, FenceStore, RedisStore, StoreError};
use redis::AsyncCommands as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// The Redis every test talks to.
const REDIS_ADDR: &str = "127.0.0.1:6379";

fn config(url: &str, prefix: &str) -> RedisStoreConfig {
    RedisStoreConfig {
        url: url.to_owned(),
        key_prefix: prefix.to_owned(),
        require_durable: false,
        max_batch: DEFAULT_MAX_BATCH,
        cache_capacity: DEFAULT_CACHE_CAPACITY,
    }
}

fn redis_url() -> String {
    format!("redis://{REDIS_ADDR}")
}

async fn open(config: &RedisStoreConfig) -> Arc<dyn FenceStore> {
    match RedisStore::open(config).await {
        Ok(store) => Arc::new(store),
        Err(e) => panic!(
            "these tests need a Redis server at {REDIS_ADDR} (start one with `redis-server`): {e}"
        ),
    }
}

/// A direct connection for setting up and cleaning up keys.
async fn direct() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis_url()).expect("valid url");
    match client.get_multiplexed_async_connection().await {
        Ok(connection) => connection,
        Err(e) => panic!(
            "these tests need a Redis server at {REDIS_ADDR} (start one with `redis-server`): {e}"
        ),
    }
}

/// Runs `test` with a fresh key prefix, then deletes every key under it, even when `test` fails.
async fn with_prefix<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let prefix = format!("fencegate-test:{}:", uuid::Uuid::new_v4());
    let outcome = tokio::spawn(test(prefix.clone())).await;
    delete_keys(&prefix).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn delete_keys(prefix: &str) {
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
            break;
        }
        cursor = next;
    }
    for chunk in keys.chunks(500) {
        let _: () = connection.del(chunk).await.expect("DEL");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_store_keeps_the_contract() {
    with_prefix(|prefix| async move {
        let config = config(&redis_url(), &prefix);
        support::contract::keeps_the_contract(|| open(&config)).await;
    })
    .await;
}

/// Values where comparing as doubles, or as unpadded strings, would go wrong.
const TRICKY: [u64; 14] = [
    0,
    1,
    9,
    10,
    99,
    100,
    (1 << 53) - 1,
    1 << 53,
    (1 << 53) + 1,
    (1 << 63) - 1,
    1 << 63,
    (1 << 63) + 1,
    u64::MAX - 1,
    u64::MAX,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lua_comparison_agrees_with_decide_on_tricky_tokens() {
    with_prefix(|prefix| async move {
        let store = open(&config(&redis_url(), &prefix)).await;
        let store = store.as_ref();
        let mut cases = Vec::new();
        for compare in [Compare::Monotonic, Compare::Strict] {
            for (i, &token) in TRICKY.iter().enumerate() {
                cases.push((format!("none:{compare:?}:{i}"), None, token, compare));
                for (j, &mark) in TRICKY.iter().enumerate() {
                    cases.push((format!("{compare:?}:{j}:{i}"), Some(mark), token, compare));
                }
            }
        }
        let checks = cases.iter().map(|(key, mark, token, compare)| async move {
            if let Some(mark) = mark {
                let seeded = store.advance(key, *mark, Compare::Monotonic).await;
                assert_eq!(seeded.ok(), Some(Advance::Accepted { previous: None }));
            }
            let outcome = store.advance(key, *token, *compare).await;
            assert_eq!(
                outcome.ok(),
                Some(decide(*mark, *token, *compare)),
                "mark {mark:?}, token {token}, {compare:?}"
            );
            let highest = mark.map_or(*token, |m| m.max(*token));
            assert_eq!(store.current(key).await.ok(), Some(Some(highest)));
        });
        futures_util::future::join_all(checks).await;
        store.close().await.expect("close");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn marks_are_decimal_strings_and_leading_zeros_are_ignored() {
    with_prefix(|prefix| async move {
        let store = open(&config(&redis_url(), &prefix)).await;
        let mut connection = direct().await;
        let outcome = store.advance("max", u64::MAX, Compare::Strict).await;
        assert_eq!(outcome.ok(), Some(Advance::Accepted { previous: None }));
        let raw: String = connection
            .get(format!("{prefix}mark:max"))
            .await
            .expect("GET");
        assert_eq!(raw, "18446744073709551615");

        // A mark written by hand with leading zeros still compares by value.
        let _: () = connection
            .set(format!("{prefix}mark:padded"), "0009")
            .await
            .expect("SET");
        assert_eq!(
            store.advance("padded", 9, Compare::Strict).await.ok(),
            Some(Advance::Stale { current: 9 })
        );
        assert_eq!(
            store.advance("padded", 9, Compare::Monotonic).await.ok(),
            Some(Advance::Accepted { previous: Some(9) })
        );
        assert_eq!(
            store.advance("padded", 10, Compare::Strict).await.ok(),
            Some(Advance::Accepted { previous: Some(9) })
        );

        // A mark that is not a number is an error, never an answer.
        let _: () = connection
            .set(format!("{prefix}mark:garbage"), "12x")
            .await
            .expect("SET");
        assert!(matches!(
            store.advance("garbage", 99, Compare::Monotonic).await,
            Err(StoreError::Backend { .. })
        ));
        store.close().await.expect("close");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_connection_fails_its_batch_and_later_requests_reconnect() {
    with_prefix(|prefix| async move {
        let proxy = Proxy::start().await;
        let store = open(&config(&format!("redis://{}", proxy.addr), &prefix)).await;
        let first = store.advance("k", 5, Compare::Monotonic).await;
        assert_eq!(first.ok(), Some(Advance::Accepted { previous: None }));

        proxy.sever();
        // Aborted tasks drop their sockets on the runtime's next turn; give it a few.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let during = store.advance("k", 6, Compare::Monotonic).await;
        assert!(
            matches!(during, Err(StoreError::Backend { .. })),
            "a request on the lost connection fails: {during:?}"
        );

        let after = store.advance("k", 7, Compare::Monotonic).await;
        assert_eq!(
            after.ok(),
            Some(Advance::Accepted { previous: Some(5) }),
            "the writer reconnected and the mark is intact"
        );
        assert_eq!(store.current("k").await.ok(), Some(Some(7)));
        store.close().await.expect("close");
        assert!(matches!(store.current("k").await, Err(StoreError::Closed)));
    })
    .await;
}

#[tokio::test]
async fn opening_an_unreachable_server_fails_naming_the_url() {
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let url = "redis://:secret@127.0.0.1:1";
    let error = match RedisStore::open(&config(url, "unused:")).await {
        Ok(_) => panic!("opening an unreachable server succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("127.0.0.1:1"), "{error}");
    assert!(!error.contains("secret"), "the password leaked: {error}");
}

#[tokio::test]
async fn require_durable_follows_the_servers_persistence_settings() {
    let mut connection = direct().await;
    let mut settings = Vec::new();
    for name in ["appendonly", "appendfsync"] {
        let pairs: HashMap<String, String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query_async(&mut connection)
            .await
            .expect("CONFIG GET");
        settings.push(pairs.get(name).cloned().unwrap_or_default());
    }
    let durable = settings == ["yes", "always"];

    let mut strict = config(&redis_url(), "fencegate-test:durable:");
    strict.require_durable = true;
    match RedisStore::open(&strict).await {
        Ok(store) => {
            assert!(durable, "a server without appendfsync always was accepted");
            store.close().await.expect("close");
        }
        Err(StoreError::Setup { backend, detail }) => {
            assert!(!durable, "a durable server was refused: {detail}");
            assert_eq!(backend, "redis");
            assert!(detail.contains("appendonly"), "{detail}");
            assert!(detail.contains("appendfsync always"), "{detail}");
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// A TCP forwarder to the test Redis whose connections can all be cut at once.
struct Proxy {
    addr: std::net::SocketAddr,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Proxy {
    async fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let connections = Arc::new(Mutex::new(Vec::new()));
        let tracked = Arc::clone(&connections);
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let forward = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(REDIS_ADDR).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tracked
                    .lock()
                    .expect("proxy lock")
                    .push(forward.abort_handle());
            }
        })
        .abort_handle();
        Proxy {
            addr,
            connections,
            accept,
        }
    }

    /// Drops every open connection (both sides see the socket close); new ones are accepted.
    fn sever(&self) {
        for connection in self.connections.lock().expect("proxy lock").drain(..) {
            connection.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.sever();
        self.accept.abort();
    }
}
