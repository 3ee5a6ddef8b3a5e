//! Fail closed (I5): when the store fails or does not answer within the route's `store_timeout`,
//! a fenced request is refused with 503 and `Retry-After` and never forwarded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencegate::config::Compare;
use fencegate::store::{Advance, FenceStore, StoreError, StoreFuture, StoreIdentity};

use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

/// A store whose every operation fails.
struct FailingStore;

impl FenceStore for FailingStore {
    fn advance(&self, _: &str, _: u64, _: Compare) -> StoreFuture<'_, Advance> {
        Box::pin(async { Err(StoreError::Closed) })
    }
    fn current(&self, _: &str) -> StoreFuture<'_, Option<u64>> {
        Box::pin(async { Err(StoreError::Closed) })
    }
    fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        Box::pin(async { Err(StoreError::Closed) })
    }
    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn backend(&self) -> &'static str {
        "failing"
    }
}

/// A store that never answers (a stalled disk or a partitioned server).
struct StallingStore;

impl FenceStore for StallingStore {
    fn advance(&self, _: &str, _: u64, _: Compare) -> StoreFuture<'_, Advance> {
        Box::pin(std::future::pending())
    }
    fn current(&self, _: &str) -> StoreFuture<'_, Option<u64>> {
        Box::pin(std::future::pending())
    }
    fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        Box::pin(std::future::pending())
    }
    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn backend(&self) -> &'static str {
        "stalling"
    }
}

fn route(upstream: &RecordingUpstream, mode: &str) -> String {
    format!(
        "[[routes]]\nname = \"pay\"\npath = \"/pay/{{id}}\"\nupstream = \"{}\"\nresource_key = \"pay:{{id}}\"\n[routes.fence]\nmode = \"{mode}\"\nstore_timeout = \"200ms\"\n",
        upstream.url()
    )
}

#[tokio::test]
async fn a_failing_store_refuses_with_503_and_forwards_nothing() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::builder(&route(&upstream, "enforce"))
        .store(Arc::new(FailingStore))
        .start()
        .await;
    let reply = send("POST", &gw.url("/pay/1"), &[("x-fence", "1")], "").await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.problem_slug(), "store-unavailable");
    let claim = send(
        "POST",
        &gw.url("/_fencegate/claim/pay:1"),
        &[("x-fence", "1")],
        "",
    )
    .await;
    assert_eq!(claim.status, 503);
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn a_stalled_store_is_given_up_on_after_store_timeout() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::builder(&route(&upstream, "enforce"))
        .store(Arc::new(StallingStore))
        .start()
        .await;
    let started = Instant::now();
    let reply = send("POST", &gw.url("/pay/1"), &[("x-fence", "1")], "").await;
    let waited = started.elapsed();
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn observe_mode_forwards_through_store_failures() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::builder(&route(&upstream, "observe"))
        .store(Arc::new(FailingStore))
        .start()
        .await;
    let reply = send("POST", &gw.url("/pay/1"), &[("x-fence", "1")], "").await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(
        fencegate::route::RouteCounters::read(&gw.route("pay").counters().store_errors),
        1
    );
}

/// A fail_open route forwards through a failing store, and the export counts each such forward
/// (the counter was kept but never rendered).
#[tokio::test]
async fn fail_open_forwards_are_exported() {
    use crate::support::admin_api::{metric, AdminApi};
    const TOKEN: &str = "fail-open-metrics-token";
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let routes = route(&upstream, "enforce") + "on_store_error = \"fail_open\"\n";
    let gw = TestGateway::builder(&routes)
        .store(Arc::new(FailingStore))
        .admin(TOKEN)
        .start()
        .await;
    for id in 1..=2 {
        let reply = send(
            "POST",
            &gw.url(&format!("/pay/{id}")),
            &[("x-fence", "1")],
            "",
        )
        .await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    assert_eq!(upstream.seen().len(), 2);
    let exposition = AdminApi::of(&gw, TOKEN).metrics().await;
    assert_eq!(
        metric(
            &exposition,
            "fencegate_fence_failed_open_total{route=\"pay\"}"
        ),
        Some(2.0),
        "{exposition}"
    );
}
