//! Serialized routes on PostgreSQL, where the ordering gate makes the fence's compare-and-advance
//! in the statement that takes the key's cross-replica turn: a token the gateway's cache cannot
//! refuse (a newer one went through another replica) is refused under the turn and never
//! forwarded; a request that queued behind a busy key is still superseded by a newer token that
//! arrives while it waits. Real gateway processes on one PostgreSQL schema.
//! PostgreSQL must be running on 127.0.0.1:5432: these tests fail, never skip, when it is not.

use std::time::Duration;

use crate::support;
use crate::support::gateway::fenced_route;
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream, Seen};

fn store(schema: &str) -> String {
    format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\nschema = \"{schema}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_below_another_replicas_admission_is_refused_under_the_lock() {
    let schema = unique_schema();
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = fenced_route("acct", &upstream.url(), "enforce", "monotonic");
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    // Replica a's metrics show which path its writes took.
    let admin = support::process::free_port();
    let a_store = format!(
        "{}\n[admin]\nlisten = \"{admin}\"\ntoken = \"ordering-postgres-test\"\n",
        store(&schema)
    );
    let a = GatewayProcess::start_with_store(dirs[0].path(), &a_store, &route);
    let b = GatewayProcess::start_with_store(dirs[1].path(), &store(&schema), &route);
    let put = |url: String, token: &'static str| async move {
        send("PUT", &url, &[("x-fence", token)], "").await
    };
    assert_eq!(put(a.url("/acct/1"), "5").await.status, 200);
    assert_eq!(put(b.url("/acct/1"), "7").await.status, 200);
    // Replica a has only seen 5: its cache lets 6 through to the gate, whose advance meets 7.
    let stale = put(a.url("/acct/1"), "6").await;
    assert_eq!(stale.status, 409);
    assert_eq!(stale.problem_slug(), "stale-fence");
    assert_eq!(stale.header("x-fence-current"), Some("7"));
    // The refusal raised a's cache: the same token is now refused before the gate, with the
    // same answer.
    let again = put(a.url("/acct/1"), "6").await;
    assert_eq!(again.status, 409);
    assert_eq!(again.header("x-fence-current"), Some("7"));
    assert_eq!(put(a.url("/acct/1"), "8").await.status, 200);
    let tokens: Vec<Option<u64>> = upstream.seen().iter().map(Seen::fence).collect();
    assert_eq!(tokens, [Some(5), Some(7), Some(8)]);
    // Three advances made by a's gate (5, 6 and 8), none by its fence.
    let metrics = send("GET", &format!("http://{admin}/metrics"), &[], "").await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    let count = |op: &str| {
        let line = format!(
            "fencegate_store_operation_duration_seconds_count{{backend=\"postgres\",op=\"{op}\"}}"
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map(|v| v.trim().parse::<u64>().unwrap())
    };
    // Three advances made by a's gate (5, 6 and 8), none by its fence: each in the statement
    // that takes the key's turn, or — when b's turn was still held (its release is batched) —
    // once a held the turn after waiting for it.
    let by_gate =
        count("gate_advance").unwrap_or(0) + count("gate_advance_after_wait").unwrap_or(0);
    assert_eq!(by_gate, 3, "{metrics}");
    assert_eq!(count("advance"), None, "{metrics}");
    drop((a, b));
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_superseded_while_it_waits_is_refused_on_postgres_too() {
    let schema = unique_schema();
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = fenced_route("acct", &upstream.url(), "enforce", "monotonic");
    let dir = tempfile::tempdir().unwrap();
    let gateway = GatewayProcess::start_with_store(dir.path(), &store(&schema), &route);
    support::ordering::a_write_queued_behind_a_busy_key_is_superseded(
        gateway.url("/acct/1"),
        &upstream,
        Duration::from_millis(150),
    )
    .await;
    drop(gateway);
    drop_schema(&schema).await;
}
