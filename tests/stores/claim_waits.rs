//! A claim on a serialized route answers only once every older admitted write of its key has
//! finished at the upstream (docs/design.md §5): when its 200 arrives, no write with a token below
//! the claimed one is still at the upstream, and none reaches it later. Write A (token 1) is held
//! at the upstream, write B (token 1) queues behind it, then token 2 is claimed; on the embedded
//! store and on PostgreSQL.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::gateway::{embedded_store, serialized_route};
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::{send, Behavior, RecordingUpstream, TestGateway, DELAY_HEADER};

/// How long the upstream holds write A.
const HOLD_MS: &str = "800";
/// How long the writes may take to reach the gateway (B) or the upstream (A).
const ARRIVAL: Duration = Duration::from_secs(5);
/// The older holder's token, and the token claimed after it.
const OLD_TOKEN: u64 = 1;
const CLAIMED: u64 = 2;
const ADMIN_TOKEN: &str = "claim-waits-admin-token";

/// A serialized `acct` route (key `acct:{id}`) and an admin listener whose metrics show the
/// requests the gateway is handling.
fn routes(upstream: &RecordingUpstream) -> String {
    let route = serialized_route("acct", &upstream.url());
    format!("{route}[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{ADMIN_TOKEN}\"\n")
}

/// `fencegate_inflight_requests` of the `acct` route, from the admin listener's metrics.
async fn in_gateway(gw: &TestGateway) -> i64 {
    let metrics = send("GET", &gw.admin_url("/metrics"), &[], "").await;
    assert_eq!(metrics.status, 200, "metrics: {:?}", metrics.body);
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix("fencegate_inflight_requests{route=\"acct\"} "))
        .map_or(0, |value| {
            value
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("in-flight gauge {value:?}: {e}"))
        })
}

/// Polls `condition` until it holds, failing with `what` after [`ARRIVAL`].
async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + ARRIVAL;
    while !condition().await {
        assert!(Instant::now() < deadline, "{what} within {ARRIVAL:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn write(gw: &TestGateway, name: &str, hold_ms: Option<&str>) -> tokio::task::JoinHandle<u16> {
    let url = gw.url("/acct/1");
    let name = name.to_owned();
    let hold = hold_ms.map(str::to_owned);
    tokio::spawn(async move {
        let token = OLD_TOKEN.to_string();
        let mut headers = vec![("x-fence", token.as_str()), ("x-write", name.as_str())];
        if let Some(hold) = &hold {
            headers.push((DELAY_HEADER, hold.as_str()));
        }
        send("PUT", &url, &headers, "").await.status.as_u16()
    })
}

/// An upstream and a gateway in front of it on the `[store]` table `store_toml` gives for the
/// gateway's directory (which lives as long as the returned `TempDir`).
async fn start(
    store_toml: impl FnOnce(&Path) -> String,
) -> (TestGateway, RecordingUpstream, tempfile::TempDir) {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store_toml(dir.path());
    let gw = TestGateway::builder(&routes(&upstream))
        .in_dir(dir.path())
        .store_toml(&store)
        .start()
        .await;
    (gw, upstream, dir)
}

/// A held, B queued behind it, then the claim; checked against the upstream's record.
async fn a_claim_answers_after_older_writes_finished(gw: TestGateway, upstream: RecordingUpstream) {
    let a = write(&gw, "A", Some(HOLD_MS));
    until("write A reached the upstream", || async {
        upstream.in_flight() == 1
    })
    .await;
    let b = write(&gw, "B", None);
    until("write B reached the gateway", || async {
        in_gateway(&gw).await >= 2
    })
    .await;
    let claim = send(
        "POST",
        &gw.url("/_fencegate/claim/acct:1"),
        &[("x-fence", &CLAIMED.to_string())],
        "",
    )
    .await;
    let claimed_at = Instant::now();
    assert_eq!(claim.status, 200, "claim: {:?}", claim.body);
    let (a, b) = (a.await.expect("write A"), b.await.expect("write B"));

    // What the upstream handled for the key: finished requests and torn-down ones.
    let mut handled: Vec<(String, u64, Instant, Instant)> = upstream
        .seen_under("/acct/1")
        .iter()
        .map(|s| {
            (
                s.header("x-write").unwrap_or("?").to_owned(),
                s.fence().expect("every write carries a token"),
                s.arrived,
                s.finished,
            )
        })
        .collect();
    handled.extend(
        upstream
            .abandoned()
            .iter()
            .filter(|r| r.target.starts_with("/acct/1"))
            .map(|r| {
                let token = r.fence.expect("every write carries a token");
                ("torn down".to_owned(), token, r.arrived, r.torn_down)
            }),
    );
    for (name, token, arrived, finished) in handled.iter().filter(|h| h.1 < CLAIMED) {
        assert!(
            *arrived <= claimed_at,
            "write {name} (token {token}) reached the upstream {:?} after the claim of {CLAIMED} was answered 200 (A: {a}, B: {b})",
            arrived.duration_since(claimed_at)
        );
        assert!(
            *finished <= claimed_at,
            "write {name} (token {token}) was still at the upstream {:?} after the claim of {CLAIMED} was answered 200 (A: {a}, B: {b})",
            finished.duration_since(claimed_at)
        );
    }
    assert!(
        handled.iter().any(|h| h.0 == "A"),
        "write A was forwarded (A: {a}, B: {b})"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_embedded_store_a_claim_answers_after_older_writes_finished() {
    let (gw, upstream, _dir) = start(embedded_store).await;
    a_claim_answers_after_older_writes_finished(gw, upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_claim_answers_after_older_writes_finished() {
    if let Err(e) = <sqlx::PgConnection as sqlx::Connection>::connect(TEST_POSTGRES_URL).await {
        panic!("this test needs PostgreSQL at {TEST_POSTGRES_URL}: {e}");
    }
    let schema = unique_schema();
    let store = format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\nschema = \"{schema}\"\nmax_connections = 2\n"
    );
    let (gw, upstream, _dir) = start(|_| store).await;
    // Run apart, so that the schema is dropped even when an assertion fails.
    let outcome = tokio::spawn(a_claim_answers_after_older_writes_finished(gw, upstream)).await;
    drop_schema(&schema).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
