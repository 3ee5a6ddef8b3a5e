//! The Redis store keeps the `FenceStore` and `IntentStore` contracts (`tests/support/`) against the
//! Redis at 127.0.0.1:6379, compares u64 tokens and fences exactly in its Lua scripts, and survives
//! losing its connection. Each test writes under its own key prefix and deletes its keys afterwards.
//!
//! These tests need a running Redis; without one they fail, they do not skip.

use std::collections::HashMap;
use std::sync::Arc;

use fencegate::config::{Compare, RedisStoreConfig, DEFAULT_CACHE_CAPACITY, DEFAULT_MAX_BATCH};
use fencegate::store::{
    decide, decide_begin, Advance, AdvanceAndBegin, BeginRequest, Begun, FenceStore, IntentStore,
    RedisStore, StoreError,
};
use redis::AsyncCommands as _;

use crate::support;
use crate::support::contract::TRICKY;
use crate::support::redis::{direct, redis_url, with_prefix, REDIS_ADDR};
use crate::support::relay::{Relay, RelayMode};

fn config(url: &str, prefix: &str) -> RedisStoreConfig {
    RedisStoreConfig {
        url: url.to_owned(),
        key_prefix: prefix.to_owned(),
        require_durable: false,
        turn_margin: fencegate::config::DEFAULT_TURN_MARGIN,
        max_batch: DEFAULT_MAX_BATCH,
        cache_capacity: DEFAULT_CACHE_CAPACITY,
        tls: None,
    }
}

async fn open(config: &RedisStoreConfig) -> Arc<dyn FenceStore> {
    match RedisStore::open(config).await {
        Ok(store) => Arc::new(store),
        Err(e) => panic!(
            "these tests need a Redis server at {REDIS_ADDR} (start one with `redis-server`): {e}"
        ),
    }
}

async fn open_store(config: &RedisStoreConfig) -> RedisStore {
    match RedisStore::open(config).await {
        Ok(store) => store,
        Err(e) => panic!(
            "these tests need a Redis server at {REDIS_ADDR} (start one with `redis-server`): {e}"
        ),
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
        let relay = Relay::start(REDIS_ADDR.parse().expect("address")).await;
        let store = open(&config(&format!("redis://{}", relay.addr), &prefix)).await;
        let first = store.advance("k", 5, Compare::Monotonic).await;
        assert_eq!(first.ok(), Some(Advance::Accepted { previous: None }));

        relay.set(RelayMode::Cut);
        // Cut connections close on the runtime's next turns; give it a few.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let during = store.advance("k", 6, Compare::Monotonic).await;
        assert!(
            matches!(during, Err(StoreError::Backend { .. })),
            "a request on the lost connection fails: {during:?}"
        );

        relay.set(RelayMode::Pass);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_store_keeps_the_intent_contract() {
    with_prefix(|prefix| async move {
        let store = Arc::new(open_store(&config(&redis_url(), &prefix)).await);
        support::intent_contract::keeps_the_intent_contract(
            Arc::clone(&store) as Arc<dyn IntentStore>
        )
        .await;
    })
    .await;
}

/// An idempotent write's advance and begin in one script call: the shared contract, a stale
/// token on the Lua comparison's tricky cases begins nothing, and a store whose identity record
/// is not the adopted one refuses the call before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_store_advances_and_begins_in_one_call() {
    with_prefix(|prefix| async move {
        let store = Arc::new(open_store(&config(&redis_url(), &prefix)).await);
        support::intent_contract::advance_and_begin_agrees_with_separate_calls(
            store.as_ref(),
            store.as_ref(),
            store.as_ref(),
        )
        .await;
        for (i, pair) in TRICKY.windows(2).enumerate() {
            let (low, high) = (pair[0].min(pair[1]), pair[0].max(pair[1]));
            let mark = format!("tricky-key:{i}");
            let first = store
                .advance_and_begin(
                    &mark,
                    high,
                    Compare::Strict,
                    begin_request(&format!("tricky:{i}:a"), high, 1),
                )
                .await
                .expect("first");
            assert!(matches!(first.advance, Advance::Accepted { .. }), "{high}");
            let again = store
                .advance_and_begin(
                    &mark,
                    low,
                    Compare::Strict,
                    begin_request(&format!("tricky:{i}:b"), low, 1),
                )
                .await
                .expect("second");
            assert_eq!(
                again.advance,
                Advance::Stale { current: high },
                "{low} after {high}"
            );
            assert!(again.begun.is_none());
            assert_eq!(
                store.get(&format!("tricky:{i}:b")).await.expect("get"),
                None
            );
        }
        // A store that lost its identity record (wiped) is refused, and nothing is begun.
        store.expect_identity("the-adopted-store");
        let refused = store
            .advance_and_begin(
                "wiped-key",
                5,
                Compare::Monotonic,
                begin_request("wiped", 5, 1),
            )
            .await;
        assert!(
            matches!(refused, Err(StoreError::Untrusted { .. })),
            "{refused:?}"
        );
        assert_eq!(store.get("wiped").await.expect("get"), None);
    })
    .await;
}

fn begin_request(key: &str, fence: u64, now_ms: u64) -> BeginRequest {
    BeginRequest {
        key: key.to_owned(),
        route: "payouts".to_owned(),
        fence,
        fingerprint: "fp".to_owned(),
        attempt: format!("attempt-{fence}-{now_ms}"),
        attempt_expires_ms: now_ms + 1_000,
        now_ms,
        expires_ms: now_ms + 60_000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_begin_script_agrees_with_decide_begin_on_tricky_fences() {
    with_prefix(|prefix| async move {
        let store = open_store(&config(&redis_url(), &prefix)).await;
        let store = &store;
        let mut cases = Vec::new();
        for (i, &recorded) in TRICKY.iter().enumerate() {
            for (j, &fence) in TRICKY.iter().enumerate() {
                cases.push((format!("fence:{i}:{j}"), recorded, fence));
            }
        }
        let checks = cases.iter().map(|(key, recorded, fence)| async move {
            let first = begin_request(key, *recorded, 1_000);
            assert_eq!(store.begin(first.clone()).await.ok(), Some(Begun::Fresh));
            store
                .abandon(key, &first.attempt, 1_010)
                .await
                .expect("abandon");
            let found = store.get(key).await.expect("get");
            assert_eq!(found.as_ref().map(|r| r.fence), Some(*recorded));
            let retry = begin_request(key, *fence, 1_020);
            let (expected, _) = decide_begin(found.as_ref(), &retry);
            assert_eq!(
                store.begin(retry).await.ok(),
                Some(expected.clone()),
                "recorded fence {recorded}, retry with fence {fence}"
            );
            let now = store.get(key).await.expect("get").map(|r| r.fence);
            let winner = match expected {
                Begun::Resubmit { .. } => *fence,
                _ => *recorded,
            };
            assert_eq!(
                now,
                Some(winner),
                "recorded fence {recorded}, retry {fence}"
            );
        });
        futures_util::future::join_all(checks).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn intents_are_hashes_with_decimal_fences_in_both_indexes() {
    with_prefix(|prefix| async move {
        let store = open_store(&config(&redis_url(), &prefix)).await;
        let mut connection = direct().await;
        let first = begin_request("raw", u64::MAX, 7_000);
        assert_eq!(store.begin(first).await.ok(), Some(Begun::Fresh));
        let fields: HashMap<String, String> = connection
            .hgetall(format!("{prefix}intent:raw"))
            .await
            .expect("HGETALL");
        assert_eq!(
            fields.get("fence").map(String::as_str),
            Some("18446744073709551615")
        );
        assert_eq!(fields.get("state").map(String::as_str), Some("SUBMITTING"));
        assert!(!fields.contains_key("outcome"));
        let score = |index: &'static str| {
            let mut connection = connection.clone();
            let index = format!("{prefix}{index}");
            async move {
                let score: Option<f64> = connection.zscore(index, "raw").await.expect("ZSCORE");
                score
            }
        };
        assert_eq!(score("intents:submitting").await, Some(7_000.0));
        assert_eq!(score("intents:expiry").await, Some(67_000.0));

        // A completed intent leaves the submitting index and keeps its retention.
        let answer = fencegate::store::StoredOutcome {
            status: 200,
            headers: Vec::new(),
            body: bytes::Bytes::from_static(b"done"),
            body_complete: true,
        };
        assert_eq!(
            store.complete("raw", answer.clone(), 7_100).await.ok(),
            Some(true)
        );
        assert_eq!(score("intents:submitting").await, None);
        assert_eq!(score("intents:expiry").await, Some(67_000.0));
        let outcome: String = connection
            .hget(format!("{prefix}intent:raw"), "outcome")
            .await
            .expect("HGET");
        assert_eq!(outcome, answer.to_json());

        // A record the script cannot read is an error, never an answer.
        let _: () = connection
            .hset(format!("{prefix}intent:raw"), "fence", "12x")
            .await
            .expect("HSET");
        assert!(matches!(
            store.begin(begin_request("raw", 1, 7_200)).await,
            Err(StoreError::Backend { .. })
        ));
        store.close().await.expect("close");
    })
    .await;
}

/// The writer sends every advance of a batch in one script call: each advance still gets its own
/// answer, and one key's broken mark fails only that key's advance.
#[tokio::test]
async fn advances_sharing_one_script_call_are_answered_each_on_its_own() {
    with_prefix(|prefix| async move {
        let store = open(&config(&redis_url(), &prefix)).await;
        let mut connection = direct().await;
        let _: () = connection
            .set(format!("{prefix}mark:broken"), "not-a-number")
            .await
            .expect("SET");
        let _: () = connection
            .set(format!("{prefix}mark:high"), "100")
            .await
            .expect("SET");
        // One thread, all in flight at once: they queue behind the first and share its batch.
        let mut advances = Vec::new();
        for i in 0..40u64 {
            let key = format!("k{i}");
            advances.push(store.advance(&key, i + 1, Compare::Strict));
        }
        advances.push(store.advance("broken", 5, Compare::Strict));
        advances.push(store.advance("high", 50, Compare::Strict));
        advances.push(store.advance("high", 150, Compare::Strict));
        let outcomes = futures_util::future::join_all(advances).await;
        for outcome in &outcomes[..40] {
            assert_eq!(
                outcome.as_ref().ok(),
                Some(&Advance::Accepted { previous: None })
            );
        }
        assert!(
            matches!(outcomes[40], Err(StoreError::Backend { .. })),
            "the broken mark fails its own advance: {:?}",
            outcomes[40]
        );
        assert_eq!(
            outcomes[41].as_ref().ok(),
            Some(&Advance::Stale { current: 100 })
        );
        assert_eq!(
            outcomes[42].as_ref().ok(),
            Some(&Advance::Accepted {
                previous: Some(100)
            })
        );
        assert_eq!(store.current("k39").await.ok(), Some(Some(40)));
        store.close().await.expect("close");
    })
    .await;
}

/// Each runtime thread gets its own writer and connection; the script's atomicity keeps one key's
/// advances from several threads consistent (I1: no token is accepted at or below one accepted
/// before it, under `strict`), and a closed store starts no new writer on any thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_on_several_threads_keep_one_keys_marks_consistent() {
    with_prefix(|prefix| async move {
        let store = open(&config(&redis_url(), &prefix)).await;
        support::contract::advances_from_many_tasks_form_one_chain(
            Arc::clone(&store),
            "shared",
            8,
            200,
        )
        .await;
        support::contract::closed_store_refuses_on_every_thread(store, "shared").await;
    })
    .await;
}
