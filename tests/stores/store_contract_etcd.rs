//! The etcd store keeps the `FenceStore` and `IntentStore` contracts (`tests/support/`) against the
//! etcd at 127.0.0.1:2379, compares u64 tokens exactly as 20-digit values, answers every advance
//! of a shared transaction on its own, and survives losing its connection. Each test writes under
//! its own key prefix and deletes its keys afterwards.
//!
//! These tests need a running etcd (scripts/ensure-services.sh starts one); without one they
//! fail, they do not skip.

use std::sync::Arc;

use fencegate::config::{
    Compare, EtcdStoreConfig, DEFAULT_CACHE_CAPACITY, DEFAULT_ETCD_MAX_BATCH,
    DEFAULT_ETCD_REQUEST_TIMEOUT, DEFAULT_TURN_MARGIN,
};
use fencegate::store::{
    decide, decide_begin, Advance, AdvanceAndBegin, BeginRequest, Begun, EtcdStore, FenceStore,
    IntentState, IntentStore, Resolution, StoreError, StoredOutcome, TakeTurn, TurnStore,
};

use crate::support;
use crate::support::contract::TRICKY;
use crate::support::etcd::{etcd_url, get, mod_revision, put, with_prefix, ETCD_ADDR};
use crate::support::relay::{Relay, RelayMode};

pub fn config(endpoints: &[String], prefix: &str) -> EtcdStoreConfig {
    EtcdStoreConfig {
        endpoints: endpoints.to_vec(),
        key_prefix: prefix.to_owned(),
        username: None,
        password_env: None,
        password_file: None,
        request_timeout: DEFAULT_ETCD_REQUEST_TIMEOUT,
        turn_margin: DEFAULT_TURN_MARGIN,
        max_batch: DEFAULT_ETCD_MAX_BATCH,
        cache_capacity: DEFAULT_CACHE_CAPACITY,
        tls: None,
    }
}

async fn open_store(config: &EtcdStoreConfig) -> EtcdStore {
    match EtcdStore::open(config).await {
        Ok(store) => store,
        Err(e) => panic!(
            "these tests need etcd at {ETCD_ADDR} (scripts/ensure-services.sh starts one): {e}"
        ),
    }
}

async fn open(config: &EtcdStoreConfig) -> Arc<dyn FenceStore> {
    Arc::new(open_store(config).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_store_keeps_the_contract() {
    with_prefix(|prefix| async move {
        let config = config(&[etcd_url()], &prefix);
        support::contract::keeps_the_contract(|| open(&config)).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_transaction_agrees_with_decide_on_tricky_tokens() {
    with_prefix(|prefix| async move {
        let store = open(&config(&[etcd_url()], &prefix)).await;
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
async fn marks_are_twenty_digits_and_anything_else_is_an_error() {
    with_prefix(|prefix| async move {
        let store = open(&config(&[etcd_url()], &prefix)).await;
        let outcome = store.advance("max", u64::MAX, Compare::Strict).await;
        assert_eq!(outcome.ok(), Some(Advance::Accepted { previous: None }));
        assert_eq!(
            get(&format!("{prefix}mark/max")).await.as_deref(),
            Some("18446744073709551615")
        );
        store
            .advance("small", 7, Compare::Strict)
            .await
            .expect("advance");
        assert_eq!(
            get(&format!("{prefix}mark/small")).await.as_deref(),
            Some("00000000000000000007")
        );

        // A mark written by hand in another form is an error, never an answer: "9" orders
        // after "10000000000000000000" byte by byte.
        put(&format!("{prefix}mark/short"), "9").await;
        assert!(matches!(
            store.advance("short", 10, Compare::Monotonic).await,
            Err(StoreError::Backend { .. })
        ));
        assert!(matches!(
            store.current("short").await,
            Err(StoreError::Backend { .. })
        ));
        store.close().await.expect("close");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_connection_fails_its_batch_and_later_requests_reconnect() {
    with_prefix(|prefix| async move {
        let relay = Relay::start(ETCD_ADDR.parse().expect("address")).await;
        let store = open(&config(&[format!("http://{}", relay.addr)], &prefix)).await;
        let first = store.advance("k", 5, Compare::Monotonic).await;
        assert_eq!(first.ok(), Some(Advance::Accepted { previous: None }));

        relay.set(RelayMode::Cut);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let during = store.advance("k", 6, Compare::Monotonic).await;
        assert!(
            matches!(during, Err(StoreError::Backend { .. })),
            "a request on the lost connection fails: {during:?}"
        );

        relay.set(RelayMode::Pass);
        let after = store.advance("k", 7, Compare::Monotonic).await;
        assert!(
            matches!(
                after,
                Ok(Advance::Accepted {
                    previous: Some(5 | 6)
                })
            ),
            "the client reconnected and the mark is intact: {after:?}"
        );
        assert_eq!(store.current("k").await.ok(), Some(Some(7)));
        store.close().await.expect("close");
        assert!(matches!(store.current("k").await, Err(StoreError::Closed)));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_passed_over_for_the_next() {
    with_prefix(|prefix| async move {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let endpoints = ["http://127.0.0.1:1".to_owned(), etcd_url()];
        let store = open(&config(&endpoints, &prefix)).await;
        let outcome = store.advance("k", 3, Compare::Strict).await;
        assert_eq!(outcome.ok(), Some(Advance::Accepted { previous: None }));
        store.close().await.expect("close");
    })
    .await;
}

#[tokio::test]
async fn opening_an_unreachable_cluster_fails_naming_the_endpoints() {
    let error = match EtcdStore::open(&config(&["http://127.0.0.1:1".to_owned()], "unused/")).await
    {
        Ok(_) => panic!("opening an unreachable cluster succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("127.0.0.1:1"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_identity_names_the_record_and_the_cluster() {
    with_prefix(|prefix| async move {
        let store = open(&config(&[etcd_url()], &prefix)).await;
        let identity = store.identity().await.expect("identity");
        assert!(identity.created);
        let record = get(&format!("{prefix}store_id")).await.expect("record");
        let (id_record, cluster) = identity.id.split_once('@').expect("record@cluster");
        assert_eq!(id_record, record);
        assert_eq!(cluster.len(), 16, "{cluster}");
        // Adopted, the store refuses every advance once the record is replaced (a wipe and a
        // new gateway's record), in the advance's own transaction.
        store.expect_identity(&identity.id);
        assert!(store.advance("k", 1, Compare::Strict).await.is_ok());
        put(&format!("{prefix}store_id"), "someone-else").await;
        let refused = store.advance("k", 2, Compare::Strict).await;
        assert!(
            matches!(&refused, Err(StoreError::Untrusted { reason }) if reason.contains("someone-else")),
            "{refused:?}"
        );
        assert_eq!(store.current("k").await.ok(), Some(Some(1)));
        store.close().await.expect("close");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_store_keeps_the_intent_contract() {
    with_prefix(|prefix| async move {
        let store = Arc::new(open_store(&config(&[etcd_url()], &prefix)).await);
        support::intent_contract::keeps_the_intent_contract(
            Arc::clone(&store) as Arc<dyn IntentStore>
        )
        .await;
    })
    .await;
}

fn charged(status: u16) -> StoredOutcome {
    StoredOutcome {
        status,
        headers: Vec::new(),
        body: bytes::Bytes::from_static(b"charged"),
        body_complete: true,
    }
}

/// An idempotent write's advance and begin in one transaction of the advance batch, and its
/// outcome in one compare-and-swap of the outcome batch: the shared contract; many at once, with
/// two resource keys sharing one intent key (one begins, the other finds it in flight, never two
/// fresh attempts); a stale token begins nothing; an outcome whose record another gateway
/// replaced meanwhile is recorded on that record, not on the one this gateway wrote; and a store
/// that lost its identity record begins nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_store_advances_and_begins_in_one_transaction() {
    with_prefix(|prefix| async move {
        let store = Arc::new(open_store(&config(&[etcd_url()], &prefix)).await);
        support::intent_contract::advance_and_begin_agrees_with_separate_calls(
            store.as_ref(),
            store.as_ref(),
            store.as_ref(),
        )
        .await;

        // 40 writes on their own keys, and two resource keys sharing one intent key, at once.
        let mut calls = Vec::new();
        for i in 0..40u64 {
            calls.push(store.advance_and_begin(
                &format!("many-key:{i}"),
                10 + i,
                Compare::Strict,
                begin_request(&format!("many:{i}"), 10 + i, 1),
            ));
        }
        calls.push(store.advance_and_begin(
            "shared-a",
            5,
            Compare::Strict,
            begin_request("shared", 5, 1),
        ));
        calls.push(store.advance_and_begin(
            "shared-b",
            5,
            Compare::Strict,
            begin_request("shared", 5, 1),
        ));
        let answers = futures_util::future::join_all(calls).await;
        for (i, answer) in answers.iter().take(40).enumerate() {
            let answer = answer.as_ref().expect("advance and begin");
            assert!(matches!(answer.advance, Advance::Accepted { .. }), "{i}");
            assert_eq!(
                answer.begun.as_ref().map(|b| b.as_ref().ok()),
                Some(Some(&Begun::Fresh))
            );
        }
        let shared: Vec<Begun> = answers
            .into_iter()
            .skip(40)
            .map(|a| a.expect("shared").begun.expect("accepted").expect("begun"))
            .collect();
        assert_eq!(
            shared.iter().filter(|b| **b == Begun::Fresh).count(),
            1,
            "one intent key, one fresh attempt: {shared:?}"
        );
        assert!(
            shared.iter().any(|b| matches!(b, Begun::InFlight { .. })),
            "{shared:?}"
        );

        // Their outcomes at once, twice for one key: each recorded once.
        let mut outcomes = Vec::new();
        for i in 0..40u64 {
            outcomes.push(store.complete(&format!("many:{i}"), charged(201), 2));
        }
        outcomes.push(store.complete("many:0", charged(201), 2));
        let recorded = futures_util::future::join_all(outcomes).await;
        let recorded: Vec<bool> = recorded.into_iter().map(|r| r.expect("complete")).collect();
        assert_eq!(recorded.iter().filter(|r| **r).count(), 40, "{recorded:?}");
        for i in 0..40u64 {
            let record = store
                .get(&format!("many:{i}"))
                .await
                .expect("get")
                .expect("kept");
            assert_eq!(record.state, IntentState::Completed);
            assert_eq!(record.outcome.map(|o| o.status), Some(201));
        }

        // Another gateway releases the intent and begins it again with another request: this
        // gateway's outcome lands on that record (as a read-then-swap would), never by writing
        // back the record it began.
        let other = open_store(&config(&[etcd_url()], &prefix)).await;
        let mine = store
            .advance_and_begin(
                "taken-key",
                3,
                Compare::Strict,
                begin_request("taken", 3, 1),
            )
            .await
            .expect("mine");
        assert_eq!(mine.begun.expect("accepted").expect("begun"), Begun::Fresh);
        assert!(other
            .resolve("taken", Resolution::Release, 2)
            .await
            .expect("release"));
        let theirs = BeginRequest {
            fingerprint: "theirs".to_owned(),
            ..begin_request("taken", 4, 3)
        };
        assert_eq!(other.begin(theirs).await.expect("theirs"), Begun::Fresh);
        assert!(store
            .complete("taken", charged(202), 4)
            .await
            .expect("complete"));
        let record = store.get("taken").await.expect("get").expect("kept");
        assert_eq!(
            (record.fingerprint.as_str(), record.fence, record.state),
            ("theirs", 4, IntentState::Completed)
        );

        // A stale token begins nothing.
        let stale = store
            .advance_and_begin("taken-key", 2, Compare::Strict, begin_request("late", 2, 5))
            .await
            .expect("stale");
        assert_eq!(stale.advance, Advance::Stale { current: 3 });
        assert!(stale.begun.is_none());
        assert_eq!(store.get("late").await.expect("get"), None);

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
        store.close().await.expect("close");
    })
    .await;
}

fn turn(key: &str, turn: u64) -> TakeTurn {
    TakeTurn {
        key: key.to_owned(),
        turn,
        lease: std::time::Duration::from_secs(30),
        advance: None,
    }
}

/// A thread's concurrent takes share transactions: 30 free keys taken at once are written at a
/// few revisions, not 30, and each take is still answered as if it ran alone: a key another
/// replica holds is refused, a mark at or above the token is answered as found, a broken mark
/// fails only its own take, and a key taken twice at once is taken both times.
#[tokio::test]
async fn takes_sharing_one_transaction_are_answered_each_on_its_own() {
    with_prefix(|prefix| async move {
        let store = open_store(&config(&[etcd_url()], &prefix)).await;
        let (mine, theirs) = (store.turns("holder-a"), store.turns("holder-b"));
        assert_eq!(
            theirs.take(turn("held", 1)).await.expect("take"),
            Some(None)
        );
        put(&format!("{prefix}mark/high"), "00000000000000000100").await;
        put(&format!("{prefix}mark/broken"), "not-a-number").await;
        let advancing = |key: &str, token: u64| TakeTurn {
            advance: Some(token),
            ..turn(key, 1)
        };
        let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
        let mut takes: Vec<_> = keys
            .iter()
            .zip(1u64..)
            .map(|(key, token)| mine.take(advancing(key, token)))
            .collect();
        takes.push(mine.take(turn("held", 1)));
        takes.push(mine.take(advancing("high", 50)));
        takes.push(mine.take(advancing("broken", 5)));
        takes.push(mine.take(turn("k0", 2)));
        let answers = futures_util::future::join_all(takes).await;
        for answer in &answers[..30] {
            assert_eq!(answer.as_ref().ok(), Some(&Some(None)));
        }
        assert_eq!(answers[30].as_ref().ok(), Some(&None), "held by another");
        assert_eq!(answers[31].as_ref().ok(), Some(&Some(Some(100))));
        assert!(
            matches!(answers[32], Err(StoreError::Backend { .. })),
            "the broken mark fails its own take: {:?}",
            answers[32]
        );
        // k0 twice: both taken by their holder, in whichever order they reached etcd (in one
        // transaction, etcd would have refused the whole batch for writing a key twice).
        assert!(
            matches!(answers[33], Ok(Some(_))),
            "k0's second take: {:?}",
            answers[33]
        );
        let k0 = get(&format!("{prefix}turn/k0")).await;
        assert!(
            matches!(k0.as_deref(), Some("holder-a 1" | "holder-a 2")),
            "{k0:?}"
        );
        assert_eq!(
            get(&format!("{prefix}mark/k29")).await.as_deref(),
            Some("00000000000000000030")
        );
        let mut revisions = std::collections::BTreeSet::new();
        for key in &keys[1..] {
            revisions.insert(
                mod_revision(&format!("{prefix}turn/{key}"))
                    .await
                    .expect("a taken turn"),
            );
        }
        assert!(
            revisions.len() <= 4,
            "29 takes written at {} revisions: {revisions:?}",
            revisions.len()
        );
        TurnStore::close(&mine).await.expect("close");
        store.close().await.expect("close");
    })
    .await;
}

/// Turns released together go in one batch of conditional deletes: 50 keys released at once are
/// all free for another holder at once (well before their 30 s leases), and a key released twice
/// in a row (an earlier turn of ours replaced by the next, then both given back) is freed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn turns_released_together_are_all_given_back() {
    with_prefix(|prefix| async move {
        let store = open_store(&config(&[etcd_url()], &prefix)).await;
        let (mine, theirs) = (store.turns("holder-a"), store.turns("holder-b"));
        let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
        for key in &keys {
            assert_eq!(mine.take(turn(key, 1)).await.expect("take"), Some(None));
        }
        // The same key taken again by its holder: the earlier turn is replaced.
        assert_eq!(mine.take(turn("k0", 2)).await.expect("retake"), Some(None));
        assert_eq!(theirs.take(turn("k0", 1)).await.expect("held"), None);
        for key in &keys {
            mine.release(key.clone(), 1, std::time::Duration::from_secs(30));
        }
        mine.release("k0".to_owned(), 2, std::time::Duration::from_secs(30));
        let started = std::time::Instant::now();
        let mut free = Vec::new();
        for key in &keys {
            loop {
                if theirs.take(turn(key, 1)).await.expect("take").is_some() {
                    free.push(key.clone());
                    break;
                }
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(5),
                    "{key} was not released; free so far: {free:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        assert_eq!(free.len(), keys.len());
        TurnStore::close(&mine).await.expect("close");
        store.close().await.expect("close");
    })
    .await;
}

/// Releases queued just before a close are written before the close returns, even when the
/// serving runtime that queued them ends right after it (as the gateway's workers do): 200 keys
/// are free for another holder at the first try, not only when their 30 s leases lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_queued_before_close_are_written_by_it() {
    with_prefix(|prefix| async move {
        let store = open_store(&config(&[etcd_url()], &prefix)).await;
        let (mine, theirs) = (Arc::new(store.turns("holder-a")), store.turns("holder-b"));
        let keys: Vec<String> = (0..200).map(|i| format!("c{i}")).collect();
        for key in &keys {
            assert_eq!(mine.take(turn(key, 1)).await.expect("take"), Some(None));
        }
        let (queued, queued_rx) = std::sync::mpsc::channel::<()>();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = {
            let (mine, keys) = (Arc::clone(&mine), keys.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("serving runtime");
                runtime.block_on(async move {
                    for key in keys {
                        mine.release(key, 1, std::time::Duration::from_secs(30));
                    }
                    queued.send(()).expect("queued");
                    let _ = stop_rx.await;
                });
                // The runtime, and whatever it still runs, ends here.
            })
        };
        tokio::task::spawn_blocking(move || queued_rx.recv())
            .await
            .expect("join")
            .expect("queued");
        TurnStore::close(&*mine).await.expect("close");
        let _ = stop.send(());
        tokio::task::spawn_blocking(move || serving.join())
            .await
            .expect("join")
            .expect("serving thread");
        let mut held = Vec::new();
        for key in &keys {
            if theirs.take(turn(key, 1)).await.expect("take").is_none() {
                held.push(key.clone());
            }
        }
        assert!(
            held.is_empty(),
            "{} releases lost at close: {held:?}",
            held.len()
        );
        store.close().await.expect("close");
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
async fn begin_agrees_with_decide_begin_on_tricky_fences() {
    with_prefix(|prefix| async move {
        let store = open_store(&config(&[etcd_url()], &prefix)).await;
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
        });
        futures_util::future::join_all(checks).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intent_indexes_follow_their_records() {
    with_prefix(|prefix| async move {
        let store = open_store(&config(&[etcd_url()], &prefix)).await;
        let first = begin_request("raw", u64::MAX, 7_000);
        assert_eq!(store.begin(first).await.ok(), Some(Begun::Fresh));
        let mut keys = support::etcd::keys_under(&prefix).await;
        keys.sort();
        assert_eq!(
            keys,
            vec![
                format!("{prefix}intent/raw"),
                format!("{prefix}intents/expiry/00000000000000067000/raw"),
                format!("{prefix}intents/submitting/00000000000000007000/raw"),
            ]
        );
        let record = get(&format!("{prefix}intent/raw")).await.expect("record");
        assert!(
            record.contains("\"fence\":18446744073709551615"),
            "{record}"
        );
        // A completed intent leaves the submitting index and keeps its retention entry.
        let answer = fencegate::store::StoredOutcome {
            status: 200,
            headers: Vec::new(),
            body: bytes::Bytes::from_static(b"done"),
            body_complete: true,
        };
        assert_eq!(store.complete("raw", answer, 7_100).await.ok(), Some(true));
        let mut keys = support::etcd::keys_under(&prefix).await;
        keys.sort();
        assert_eq!(
            keys,
            vec![
                format!("{prefix}intent/raw"),
                format!("{prefix}intents/expiry/00000000000000067000/raw"),
            ]
        );
        // Pruned after retention: nothing of it is left.
        assert_eq!(store.prune(67_000, 10).await.ok(), Some(1));
        assert!(support::etcd::keys_under(&prefix).await.is_empty());

        // A record that is not what fencegate writes is an error, never an answer.
        put(&format!("{prefix}intent/bad"), "{not json").await;
        assert!(matches!(
            store.begin(begin_request("bad", 1, 7_200)).await,
            Err(StoreError::Backend { .. })
        ));
        store.close().await.expect("close");
    })
    .await;
}

/// The batcher sends a thread's concurrent advances in one transaction: each still gets its own
/// answer, and one key's broken mark fails only that key's advances.
#[tokio::test]
async fn advances_sharing_one_transaction_are_answered_each_on_its_own() {
    with_prefix(|prefix| async move {
        let store = open(&config(&[etcd_url()], &prefix)).await;
        put(&format!("{prefix}mark/broken"), "not-a-number").await;
        put(&format!("{prefix}mark/high"), "00000000000000000100").await;
        let mut advances = Vec::new();
        for i in 0..40u64 {
            let key = format!("k{i}");
            advances.push(store.advance(&key, i + 1, Compare::Strict));
        }
        advances.push(store.advance("broken", 5, Compare::Strict));
        advances.push(store.advance("high", 50, Compare::Strict));
        advances.push(store.advance("high", 150, Compare::Strict));
        advances.push(store.advance("high", 150, Compare::Strict));
        advances.push(store.advance("high", 150, Compare::Monotonic));
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
        // Whether or not they shared a transaction, each is answered as if it ran alone in turn.
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
        assert_eq!(
            outcomes[43].as_ref().ok(),
            Some(&Advance::Stale { current: 150 })
        );
        assert_eq!(
            outcomes[44].as_ref().ok(),
            Some(&Advance::Accepted {
                previous: Some(150)
            })
        );
        assert_eq!(store.current("k39").await.ok(), Some(Some(40)));
        store.close().await.expect("close");
    })
    .await;
}

/// Each runtime thread gets its own batcher; the transactions keep one key's advances from
/// several threads consistent (I1 under `strict`), and a closed store starts no new batcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batchers_on_several_threads_keep_one_keys_marks_consistent() {
    with_prefix(|prefix| async move {
        let store = open(&config(&[etcd_url()], &prefix)).await;
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
