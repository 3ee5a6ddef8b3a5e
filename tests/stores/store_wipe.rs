//! A wiped Redis or etcd prefix is noticed on the very write that would trust it (docs/design.md §4.4), not only
//! at the next periodic store check: with `store_check_interval = "60s"`, a gateway has written one
//! key, every key under its prefix is deleted (the marks and the store's identity record), and at
//! once a write of a key the gateway has never seen is refused 503 and never forwarded.

use std::path::Path;

use tokio::sync::oneshot;

use crate::support;
use crate::support::gateway::{config_text_with_store, fenced_route};
use crate::support::network_store::Backend;
use crate::support::{send, Behavior, RecordingUpstream};

/// Far longer than the test: no periodic check runs between the wipe and the write.
const STORE_CHECK_INTERVAL: &str = "60s";

/// The real gateway in process on a real socket, with the configuration `text`.
struct Gateway {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    async fn start(text: &str) -> Gateway {
        let config = fencegate::Compiled::parse(text, Path::new("store_wipe.toml"))
            .unwrap_or_else(|e| panic!("test config must load: {e}\n{text}"));
        let app = fencegate::App::build(config)
            .await
            .expect("the gateway builds on the Redis store");
        let listener = app.bind().await.expect("bind gateway");
        let addr = listener.local_addr().expect("gateway address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(app.serve(listener, async {
            let _ = stopped.await;
        }));
        Gateway { addr, stop, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("gateway task");
    }
}

/// A write of k1, the wipe, then at once a write of k2 that must be refused.
async fn keys_under(backend: Backend, prefix: &str) -> Vec<String> {
    match backend {
        Backend::Etcd => support::etcd::keys_under(prefix).await,
        _ => support::redis::keys_under(prefix).await,
    }
}

async fn delete_keys(backend: Backend, prefix: &str) {
    match backend {
        Backend::Etcd => support::etcd::delete_keys(prefix).await,
        _ => support::redis::delete_keys(prefix).await,
    }
}

async fn wipe_then_write_a_new_key(
    backend: Backend,
    gw: Gateway,
    upstream: RecordingUpstream,
    prefix: String,
) {
    // The store is adopted and used.
    let first = send("POST", &gw.url("/inv/1"), &[("x-fence", "10")], "").await;
    assert_eq!(first.status, 200, "k1 before the wipe: {:?}", first.body);
    assert!(
        !keys_under(backend, &prefix).await.is_empty(),
        "the gateway wrote under its prefix"
    );

    // The server forgot everything under the prefix, identity record included.
    delete_keys(backend, &prefix).await;
    let left = keys_under(backend, &prefix).await;
    assert!(left.is_empty(), "keys left after the wipe: {left:?}");

    let fresh = send("POST", &gw.url("/inv/2"), &[("x-fence", "1")], "").await;
    let forwarded = upstream.seen_under("/inv/2").len();
    assert!(
        fresh.status == 503 && forwarded == 0,
        "a write of a new key right after the wipe was answered {} and forwarded {forwarded} time(s): the wiped store was trusted ({:?})",
        fresh.status,
        fresh.body
    );
    assert_eq!(fresh.problem_slug(), "store-untrusted");
    assert_eq!(
        upstream.seen().len(),
        1,
        "only k1's write before the wipe was forwarded"
    );
    gw.stop().await;
}

/// Starts a gateway on `store` (under `prefix`), then wipes and writes.
async fn wiped_store_is_refused(backend: Backend, store: String, prefix: String) {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let route = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let text = config_text_with_store(dir.path(), "127.0.0.1:0", &store, &route);
    let slow_checks = text.replace(
        "store_check_interval = \"200ms\"",
        &format!("store_check_interval = \"{STORE_CHECK_INTERVAL}\""),
    );
    assert_ne!(
        slow_checks, text,
        "the test config sets store_check_interval"
    );
    let gw = Gateway::start(&slow_checks).await;
    // Run apart, so that the prefix is deleted even when an assertion fails.
    let outcome = tokio::spawn(wipe_then_write_a_new_key(
        backend,
        gw,
        upstream,
        prefix.clone(),
    ))
    .await;
    delete_keys(backend, &prefix).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

#[tokio::test]
async fn a_write_right_after_redis_was_wiped_is_refused() {
    let prefix = support::redis::unique_prefix();
    drop(support::redis::direct().await);
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n",
        support::redis::redis_url()
    );
    wiped_store_is_refused(Backend::Redis, store, prefix).await;
}

#[tokio::test]
async fn a_write_right_after_etcd_was_wiped_is_refused() {
    let prefix = support::etcd::unique_prefix();
    let store = format!(
        "[store]\nbackend = \"etcd\"\nendpoints = [\"{}\"]\nkey_prefix = \"{prefix}\"\n",
        support::etcd::etcd_url()
    );
    wiped_store_is_refused(Backend::Etcd, store, prefix).await;
}
