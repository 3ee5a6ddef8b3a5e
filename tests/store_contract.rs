//! The embedded store keeps the `FenceStore` contract (`tests/support/contract.rs`) and the
//! `IntentStore` contract (`tests/support/intent_contract.rs`).

mod support;

use std::sync::Arc;

use fencegate::store::{EmbeddedStore, FenceStore, IntentStore};

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
