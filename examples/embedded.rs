//! A service that fences its own writes: an axum router with `fencegate::embed::FencingLayer` in
//! front of its handlers, on the embedded store. No proxy: a stale lock holder's write is refused
//! before the handler runs.
//!
//! ```text
//! cargo run --release --example embedded
//! curl -X PUT -H 'X-Fence: 5' localhost:8402/accounts/7   # written
//! curl -X PUT -H 'X-Fence: 3' localhost:8402/accounts/7   # 409 stale-fence, X-Fence-Current: 5
//! ```

use std::sync::Arc;

use fencegate::embed::FencingLayer;
use fencegate::guard::CheckedStore;
use fencegate::store::{EmbeddedStore, FenceStore};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let path = std::env::var("FENCEGATE_EXAMPLE_DB")
        .unwrap_or_else(|_| "data/embedded-example.db".to_owned());
    let backend = EmbeddedStore::open(std::path::Path::new(&path), 512).await?;
    let backend: Arc<dyn FenceStore> = Arc::new(backend);
    let store = Arc::new(CheckedStore::standalone(Arc::clone(&backend), 100_000));
    // One resource key per account: the token of the lock on that account guards its writes.
    let fence = FencingLayer::new(store, |head| {
        head.uri
            .path()
            .strip_prefix("/accounts/")
            .map(|id| format!("account:{id}"))
    });
    let app = axum::Router::new()
        .route(
            "/accounts/{id}",
            axum::routing::put(|| async { "written\n" }).get(|| async { "balance\n" }),
        )
        .layer(fence);
    let address =
        std::env::var("FENCEGATE_EXAMPLE_LISTEN").unwrap_or_else(|_| "127.0.0.1:8402".to_owned());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("fenced service on http://{address} (store {path})");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    backend.close().await?;
    Ok(())
}
