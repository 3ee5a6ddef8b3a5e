//! Fail closed (I5) against a real PostgreSQL behind a TCP relay the test cuts, stalls and
//! restores: fenced requests get 503 with `Retry-After` and are not forwarded, tokens below the
//! cached mark still get 409, traffic recovers by itself, and a `fail_open` route forwards instead.

use std::time::{Duration, Instant};

use fencegate::route::RouteCounters;

use crate::support;
use crate::support::postgres::{drop_schema, unique_schema};
use crate::support::relay::{Relay, RelayMode};
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

fn routes(upstream: &RecordingUpstream) -> String {
    let mut text = String::new();
    for (name, policy) in [("closed", "fail_closed"), ("open", "fail_open")] {
        text.push_str(&format!(
            "[[routes]]\nname = \"{name}\"\npath = \"/{name}/{{id}}\"\nupstream = \"{}\"\nresource_key = \"{name}:{{id}}\"\n[routes.fence]\nstore_timeout = \"300ms\"\non_store_error = \"{policy}\"\n\n",
            upstream.url()
        ));
    }
    text
}

/// Sends until the answer has `status` (the store may take a moment to come back).
async fn until_status(gw: &TestGateway, path: &str, token: &str, status: u16) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let reply = send("POST", &gw.url(path), &[("x-fence", token)], "").await;
        if reply.status == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path}: still {} ({:?})",
            reply.status,
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn store_trouble_is_refused_and_recovers(store_toml: String, relay: Relay) {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::builder(&routes(&upstream))
        .in_dir(dir.path())
        .store_toml(&store_toml)
        .start()
        .await;
    assert_eq!(
        send("POST", &gw.url("/closed/1"), &[("x-fence", "10")], "")
            .await
            .status,
        200
    );

    for (round, mode) in [RelayMode::Cut, RelayMode::Stall].into_iter().enumerate() {
        let forwarded = upstream.seen().len();
        let base = (round as u64 + 1) * 100;
        relay.set(mode);
        let started = Instant::now();
        let refused = send(
            "POST",
            &gw.url("/closed/1"),
            &[("x-fence", &(base + 1).to_string())],
            "",
        )
        .await;
        assert_eq!(refused.status, 503, "{mode:?}");
        assert_eq!(refused.header("retry-after"), Some("1"));
        assert_eq!(refused.problem_slug(), "store-unavailable");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{mode:?}: refused within the store timeout"
        );
        // Below the cached mark: refused from the cache, with the store out of reach.
        let zombie = send("POST", &gw.url("/closed/1"), &[("x-fence", "9")], "").await;
        assert_eq!(zombie.status, 409, "{mode:?}");
        // The fail_open route forwards unchecked and counts it.
        let open = send("POST", &gw.url("/open/1"), &[("x-fence", "1")], "").await;
        assert_eq!(open.status, 200, "{mode:?}");
        assert_eq!(
            upstream.seen().len(),
            forwarded + 1,
            "{mode:?}: only the fail_open request went upstream"
        );
        relay.set(RelayMode::Pass);
        until_status(&gw, "/closed/1", &(base + 2).to_string(), 200).await;
        let last = upstream
            .seen_under("/closed/")
            .last()
            .and_then(|s| s.fence());
        assert_eq!(last, Some(base + 2), "traffic recovered without a restart");
    }
    assert_eq!(
        RouteCounters::read(&gw.route("open").counters().failed_open),
        2
    );
    assert!(RouteCounters::read(&gw.route("closed").counters().store_errors) >= 2);
    gw.stop().await;
}

#[tokio::test]
async fn postgres_trouble_fails_closed_and_recovers_without_a_restart() {
    let relay = Relay::start("127.0.0.1:5432".parse().unwrap()).await;
    let schema = unique_schema();
    let store = format!(
        "[store]\nbackend = \"postgres\"\nurl = \"postgres://postgres@{}/test\"\nschema = \"{schema}\"\nmax_connections = 4\n",
        relay.addr
    );
    store_trouble_is_refused_and_recovers(store, relay).await;
    drop_schema(&schema).await;
}

#[tokio::test]
async fn redis_trouble_fails_closed_and_recovers_without_a_restart() {
    let relay = Relay::start(support::redis::REDIS_ADDR.parse().unwrap()).await;
    let prefix = support::redis::unique_prefix();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://{}\"\nkey_prefix = \"{prefix}\"\n",
        relay.addr
    );
    store_trouble_is_refused_and_recovers(store, relay).await;
    support::redis::delete_keys(&prefix).await;
}

#[tokio::test]
async fn etcd_trouble_fails_closed_and_recovers_without_a_restart() {
    let relay = Relay::start(support::etcd::ETCD_ADDR.parse().unwrap()).await;
    let prefix = support::etcd::unique_prefix();
    let store = format!(
        "[store]\nbackend = \"etcd\"\nendpoints = [\"http://{}\"]\nkey_prefix = \"{prefix}\"\nrequest_timeout = \"1s\"\n",
        relay.addr
    );
    store_trouble_is_refused_and_recovers(store, relay).await;
    support::etcd::delete_keys(&prefix).await;
}
