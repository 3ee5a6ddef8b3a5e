//! A network store's namespace (PostgreSQL schema, Redis or etcd key prefix) for a test that runs
//! a gateway in process: like [`with_namespace`](super::network_store::with_namespace), but the
//! test runs on the caller's task instead of a spawned one (a gateway's start-up future is not
//! provably `Send` there), its panic caught so that the namespace is removed all the same.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt as _;

use super::network_store::{fresh_namespace, remove_namespace, Backend};

/// Runs `test` with a fresh namespace of `backend`, then removes it, even when `test` panics.
/// Fails (never skips) when the server cannot be reached.
pub async fn with_namespace_in_task<F, Fut, T>(backend: Backend, test: F) -> T
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = T>,
{
    let namespace = fresh_namespace(backend).await;
    let outcome = AssertUnwindSafe(test(namespace.clone()))
        .catch_unwind()
        .await;
    remove_namespace(backend, &namespace).await;
    outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
