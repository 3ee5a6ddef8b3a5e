//! The fence embedded in a service's own axum router (`fencegate::embed::FencingLayer`), served
//! on a real socket: a stale token never reaches the handler, and refusals are the gateway's
//! problem responses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use fencegate::embed::FencingLayer;
use fencegate::guard::CheckedStore;
use fencegate::store::{EmbeddedStore, FenceStore};

use crate::support::send;

/// An axum service whose writes are fenced per account, counting the writes its handler ran.
async fn fenced_service() -> (
    String,
    Arc<AtomicUsize>,
    Arc<EmbeddedStore>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(
        EmbeddedStore::open(&dir.path().join("marks.db"), 512)
            .await
            .unwrap(),
    );
    let store = Arc::new(CheckedStore::standalone(
        Arc::clone(&backend) as Arc<dyn FenceStore>,
        1024,
    ));
    let fence = FencingLayer::new(store, |head| {
        head.uri
            .path()
            .strip_prefix("/accounts/")
            .map(|id| format!("account:{id}"))
    });
    let written = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&written);
    let handler = move || {
        let counter = Arc::clone(&counter);
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            "written"
        }
    };
    let app = axum::Router::new()
        .route(
            "/accounts/{id}",
            axum::routing::put(handler).get(|| async { "balance" }),
        )
        .route("/other", axum::routing::post(|| async { "no key" }))
        .layer(fence);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, written, backend, dir)
}

#[tokio::test]
async fn a_stale_token_never_reaches_the_embedding_handler() {
    let (base, written, backend, _dir) = fenced_service().await;
    let url = format!("{base}/accounts/7");
    let put = |token: &'static str| {
        let url = url.clone();
        async move { send("PUT", &url, &[("x-fence", token)], "{}").await }
    };
    assert_eq!(put("5").await.status, 200);
    assert_eq!(put("5").await.status, 200, "the holder of 5 writes again");
    let stale = put("3").await;
    assert_eq!(stale.status, 409);
    assert_eq!(stale.header("x-fence-current"), Some("5"));
    assert_eq!(
        stale.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        stale.json()["type"],
        "https://fencegate.dev/problems/stale-fence"
    );
    assert_eq!(
        written.load(Ordering::SeqCst),
        2,
        "the stale write never ran"
    );
    // The mark is durable in the service's store.
    assert_eq!(backend.current("account:7").await.unwrap(), Some(5));

    // Reads pass unfenced; a write without a token, or without a key, is refused.
    assert_eq!(send("GET", &url, &[], "").await.status, 200);
    let missing = send("PUT", &url, &[], "{}").await;
    assert_eq!(missing.status, 428);
    assert_eq!(
        missing.json()["type"],
        "https://fencegate.dev/problems/missing-fence"
    );
    let keyless = send("POST", &format!("{base}/other"), &[("x-fence", "9")], "").await;
    assert_eq!(keyless.status, 400);
    assert_eq!(written.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_write_is_refused_when_the_store_cannot_check_it() {
    let (base, written, backend, _dir) = fenced_service().await;
    backend.close().await.unwrap();
    let refused = send(
        "PUT",
        &format!("{base}/accounts/1"),
        &[("x-fence", "1")],
        "",
    )
    .await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(written.load(Ordering::SeqCst), 0, "nothing unchecked ran");
}
