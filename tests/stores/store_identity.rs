//! A store that forgot (docs/design.md §4.4): a new embedded file, a wiped PostgreSQL table or
//! identity would reset every mark to zero and re-admit zombies. The gateway notices — from the
//! store's identity record and from answers below marks it has seen — and refuses fenced traffic
//! with 503 until an operator adopts the store.

use std::time::{Duration, Instant};

use fencegate::guard::adoption;

use crate::support;
use crate::support::gateway::fenced_route;
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

/// Several store-check intervals of the test gateways (200 ms each).
const STORE_CHECKS: Duration = Duration::from_millis(1000);

/// Deletes the embedded store's files in `dir`, keeping the gateway's state (its adoption record).
fn lose_the_embedded_store(dir: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("fencegate.db{suffix}")));
    }
}

/// Polls until a fenced write on `path` gets `status`, or fails after a few seconds.
async fn eventually(gw: &TestGateway, path: &str, token: &str, status: u16) -> support::Reply {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = send("POST", &gw.url(path), &[("x-fence", token)], "").await;
        if reply.status == status || Instant::now() > deadline {
            assert_eq!(
                reply.status, status,
                "{path} with token {token}: {:?}",
                reply.body
            );
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `on_store_error = "fail_open"` trades fencing for availability when the store *fails*; a store
/// that answers but forgot its marks is not a failure to ride out, and forwarding unchecked would
/// re-admit every zombie. Before the fix such a route forwarded the zombie's write.
#[tokio::test]
async fn a_fail_open_route_still_refuses_a_store_that_forgot() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let route = format!(
        "{}on_store_error = \"fail_open\"\n",
        fenced_route("inv", &upstream.url(), "enforce", "monotonic")
    );
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .start()
        .await;
    let first = send("POST", &gw.url("/inv/1"), &[("x-fence", "10")], "").await;
    assert_eq!(first.status, 200);
    gw.stop().await;
    lose_the_embedded_store(dir.path());
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .start()
        .await;
    let zombie = send("POST", &gw.url("/inv/1"), &[("x-fence", "5")], "").await;
    assert_eq!(zombie.status, 503, "{:?}", zombie.body);
    assert_eq!(zombie.problem_slug(), "store-untrusted");
    assert_eq!(
        upstream.seen().len(),
        1,
        "only the first write reached the upstream"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_new_embedded_file_is_refused_until_an_operator_adopts_it() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let route = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .start()
        .await;
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "10")], "")
            .await
            .status,
        200
    );
    gw.stop().await;

    // The store file is lost; the gateway's state directory (its adoption record) is not.
    lose_the_embedded_store(dir.path());
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .start()
        .await;
    let zombie = send("POST", &gw.url("/inv/1"), &[("x-fence", "5")], "").await;
    assert_eq!(
        zombie.status, 503,
        "a zombie must not pass a store that forgot its marks"
    );
    assert_eq!(zombie.problem_slug(), "store-untrusted");
    assert!(zombie.json()["detail"]
        .as_str()
        .unwrap()
        .contains("fencegate store adopt"));
    let claim = send(
        "POST",
        &gw.url("/_fencegate/claim/inv:1"),
        &[("x-fence", "11")],
        "",
    )
    .await;
    assert_eq!(claim.status, 503);
    assert_eq!(upstream.seen().len(), 1);

    // The operator decides the new store is right; traffic resumes at the next store check.
    adoption::adopt(gw.backend(), dir.path())
        .await
        .expect("adopt");
    eventually(&gw, "/inv/1", "11", 200).await;
    gw.stop().await;
}

#[tokio::test]
async fn the_adopt_command_records_the_store_for_the_next_start() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let route = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .start()
        .await;
    gw.stop().await;
    std::fs::remove_file(dir.path().join("fencegate.db")).unwrap();
    let config = dir.path().join("fencegate.toml");
    std::fs::write(
        &config,
        support::gateway::config_text(dir.path(), "127.0.0.1:0", &route),
    )
    .unwrap();
    let output = std::process::Command::new(support::process::binary())
        .args(["store", "adopt", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("adopted embedded store"));
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .start()
        .await;
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "1")], "")
            .await
            .status,
        200
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_postgres_store_that_forgets_while_serving_is_refused() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let schema = unique_schema();
    let store = format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\nschema = \"{schema}\"\n"
    );
    let route = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .store_toml(&store)
        .start()
        .await;
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "10")], "")
            .await
            .status,
        200
    );

    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(TEST_POSTGRES_URL)
        .await
        .unwrap();
    sqlx::query(&format!("DELETE FROM {schema}.fence_marks"))
        .execute(&mut db)
        .await
        .unwrap();
    // A token below a mark this gateway saw is still refused, from its cache.
    let zombie = send("POST", &gw.url("/inv/1"), &[("x-fence", "9")], "").await;
    assert_eq!(zombie.status, 409);
    assert_eq!(zombie.header("x-fence-current"), Some("10"));
    // The store now answers below that mark: the gateway stops trusting it, for every key.
    let newer = send("POST", &gw.url("/inv/1"), &[("x-fence", "11")], "").await;
    assert_eq!(newer.status, 503);
    assert_eq!(newer.problem_slug(), "store-untrusted");
    assert_eq!(
        send("POST", &gw.url("/inv/2"), &[("x-fence", "1")], "")
            .await
            .status,
        503
    );
    assert_eq!(upstream.seen().len(), 1);

    adoption::adopt(gw.backend(), dir.path())
        .await
        .expect("adopt");
    eventually(&gw, "/inv/2", "1", 200).await;

    // Losing the identity record too (a dropped schema, a restored backup) is noticed by the
    // periodic store check, without any request.
    sqlx::query(&format!("DELETE FROM {schema}.fencegate_meta"))
        .execute(&mut db)
        .await
        .unwrap();
    tokio::time::sleep(STORE_CHECKS).await;
    let refused = send("POST", &gw.url("/inv/3"), &[("x-fence", "1")], "").await;
    assert_eq!(
        refused.status, 503,
        "the first request after the loss is refused"
    );
    assert_eq!(refused.problem_slug(), "store-untrusted");
    assert_eq!(upstream.seen().len(), 2);
    gw.stop().await;
    drop_schema(&schema).await;
}

#[tokio::test]
async fn a_wiped_redis_is_refused_while_serving() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = support::redis::unique_prefix();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n",
        support::redis::redis_url()
    );
    let route = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .store_toml(&store)
        .start()
        .await;
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "10")], "")
            .await
            .status,
        200
    );

    // Redis restarted without persistence: every key is gone, the identity record too.
    support::redis::delete_keys(&prefix).await;
    let zombie = send("POST", &gw.url("/inv/1"), &[("x-fence", "9")], "").await;
    assert_eq!(zombie.status, 409, "refused from the cache");
    let newer = send("POST", &gw.url("/inv/1"), &[("x-fence", "11")], "").await;
    assert_eq!(
        newer.status, 503,
        "the store answered below a mark already seen"
    );
    assert_eq!(newer.problem_slug(), "store-untrusted");
    assert_eq!(
        send("POST", &gw.url("/inv/2"), &[("x-fence", "1")], "")
            .await
            .status,
        503
    );
    assert_eq!(upstream.seen().len(), 1);

    adoption::adopt(gw.backend(), dir.path())
        .await
        .expect("adopt");
    eventually(&gw, "/inv/2", "1", 200).await;

    // Wiped again, with no request in between: the periodic identity check notices by itself.
    support::redis::delete_keys(&prefix).await;
    tokio::time::sleep(STORE_CHECKS).await;
    let first = send("POST", &gw.url("/inv/3"), &[("x-fence", "1")], "").await;
    assert_eq!(
        first.status, 503,
        "the first request after the wipe is refused"
    );
    gw.stop().await;
    support::redis::delete_keys(&prefix).await;
}
