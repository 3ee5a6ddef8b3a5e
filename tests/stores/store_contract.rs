//! The embedded store keeps the `FenceStore` contract (`tests/support/contract.rs`) and the
//! `IntentStore` contract (`tests/support/intent_contract.rs`), and makes an advance and a begin
//! in one writer round.

use std::sync::Arc;

use fencegate::config::Compare;
use fencegate::guard::{CheckedStore, MarkCache, StoreTrust};
use fencegate::metrics::Metrics;
use fencegate::store::{Advance, AdvanceAndBegin, Begun, EmbeddedStore, FenceStore, IntentStore};

use crate::support;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.db");
    support::contract::keeps_the_contract(|| async {
        Arc::new(
            EmbeddedStore::open(&path, 512)
                .await
                .expect("open embedded store"),
        ) as Arc<dyn FenceStore>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_store_keeps_the_intent_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        EmbeddedStore::open(&dir.path().join("intents.db"), 512)
            .await
            .expect("open embedded store"),
    );
    support::intent_contract::keeps_the_intent_contract(Arc::clone(&store) as Arc<dyn IntentStore>)
        .await;
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_store_advances_and_begins_in_one_round() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        EmbeddedStore::open(&dir.path().join("both.db"), 512)
            .await
            .expect("open embedded store"),
    );
    support::intent_contract::advance_and_begin_agrees_with_separate_calls(
        store.as_ref(),
        store.as_ref(),
        store.as_ref(),
    )
    .await;
    // The same through the gateway's cache in front of the store, which must pass the round on.
    let checked = CheckedStore::new(
        Arc::clone(&store) as Arc<dyn FenceStore>,
        Some(Arc::clone(&store) as Arc<dyn AdvanceAndBegin>),
        Arc::new(MarkCache::new(1024)),
        Arc::new(StoreTrust::default()),
        Metrics::new(),
    );
    let first = fencegate::store::BeginRequest {
        key: "checked:1".to_owned(),
        route: "payouts".to_owned(),
        fence: 3,
        fingerprint: "fp".to_owned(),
        attempt: "a1".to_owned(),
        attempt_expires_ms: 2_000,
        now_ms: 1_000,
        expires_ms: 100_000,
    };
    let answer = checked
        .advance_and_begin("checked-key", 3, Compare::Monotonic, first.clone())
        .expect("passed on")
        .await
        .unwrap();
    assert_eq!(answer.advance, Advance::Accepted { previous: None });
    assert_eq!(answer.begun.expect("begun").unwrap(), Begun::Fresh);
    assert_eq!(
        checked.known_mark("checked-key"),
        Some(3),
        "the cache was raised"
    );
    // Refused from the cache: nothing reaches the store, nothing is begun.
    let stale = fencegate::store::BeginRequest {
        key: "checked:2".to_owned(),
        ..first
    };
    let answer = checked
        .advance_and_begin("checked-key", 2, Compare::Monotonic, stale)
        .expect("passed on")
        .await
        .unwrap();
    assert_eq!(answer.advance, Advance::Stale { current: 3 });
    assert!(answer.begun.is_none());
    assert_eq!(store.get("checked:2").await.unwrap(), None);
    store.close().await.unwrap();
}
