//! Issue 17: a serialized key's turn across replicas is a lease that a lost store connection does
//! not end (docs/design.md §4.5, I4). Replica A reaches the store through a relay; while A's write
//! of a key is held at the upstream, the relay is cut for 50 ms, and replica B then writes the key
//! with the next token. From the upstream's record, on PostgreSQL and on Redis: no two writes of a
//! key overlap, per key no lower token arrives after a higher one, and every 2xx was forwarded.

use std::time::{Duration, Instant};

use crate::support::gateway::serialized_route;
use crate::support::history::{check_serialized, UpstreamSpan};
use crate::support::network_store::{with_namespace, Backend};
use crate::support::relay::{Relay, RelayMode};
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream, DELAY_HEADER};

/// Keys written, one scenario each.
const ROUNDS: u64 = 3;
/// How long the upstream holds replica A's write.
const HOLD: Duration = Duration::from_millis(1000);
/// How long the relay between replica A and the store stays cut.
const CUT: Duration = Duration::from_millis(50);
/// How long A's write may take to reach the upstream.
const REACH_UPSTREAM: Duration = Duration::from_secs(5);
/// A's token; B writes with the next one.
const TOKEN: u64 = 5;

/// One write as its client saw it.
#[derive(Debug)]
struct Answer {
    seq: u64,
    replica: &'static str,
    token: u64,
    status: u16,
}

/// A's write is `2 * key`, B's `2 * key + 1`: the sequence number follows from key and token.
fn seq_of(key: u64, token: u64) -> u64 {
    2 * key + (token - TOKEN)
}

async fn write(
    url: String,
    replica: &'static str,
    key: u64,
    token: u64,
    hold: Option<Duration>,
) -> Answer {
    let seq = seq_of(key, token);
    let (token_text, seq_text) = (token.to_string(), seq.to_string());
    let hold_text = hold.map(|h| h.as_millis().to_string());
    let mut headers = vec![
        ("x-fence", token_text.as_str()),
        ("x-seq", seq_text.as_str()),
    ];
    if let Some(hold) = &hold_text {
        headers.push((DELAY_HEADER, hold.as_str()));
    }
    let reply = send("PUT", &format!("{url}/acct/{key}"), &headers, "").await;
    Answer {
        seq,
        replica,
        token,
        status: reply.status.as_u16(),
    }
}

/// What the upstream handled, finished or torn down, as spans for the I4 check.
fn spans(upstream: &RecordingUpstream) -> Vec<UpstreamSpan> {
    let key_of = |target: &str| -> u64 {
        target
            .trim_start_matches("/acct/")
            .parse()
            .expect("the upstream saw an /acct/{key} target")
    };
    let mut spans: Vec<UpstreamSpan> = upstream
        .seen()
        .iter()
        .map(|s| UpstreamSpan {
            seq: s
                .header("x-seq")
                .and_then(|v| v.parse().ok())
                .expect("every write carries x-seq"),
            key: key_of(&s.target),
            token: s.fence().expect("every write carries a token"),
            arrived: s.arrived,
            finished: s.finished,
        })
        .collect();
    spans.extend(upstream.abandoned().iter().map(|a| {
        let (key, token) = (
            key_of(&a.target),
            a.fence.expect("every write carries a token"),
        );
        UpstreamSpan {
            seq: seq_of(key, token),
            key,
            token,
            arrived: a.arrived,
            finished: a.torn_down,
        }
    }));
    spans
}

async fn a_lost_store_connection_does_not_end_a_turn(backend: Backend, namespace: String) {
    let started = Instant::now();
    let target = backend.addr();
    let relay = Relay::start(target.parse().expect("store address")).await;
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = serialized_route("acct", &upstream.url());
    let dirs: Vec<_> = (0..2)
        .map(|_| tempfile::tempdir().expect("temp dir"))
        .collect();
    // Started one after the other, so that only the first runs the PostgreSQL migrations.
    let a = GatewayProcess::start_with_store(
        dirs[0].path(),
        &backend.store_toml(&relay.addr.to_string(), &namespace),
        &route,
    );
    let b = GatewayProcess::start_with_store(
        dirs[1].path(),
        &backend.store_toml(target, &namespace),
        &route,
    );

    let mut answers = Vec::new();
    for key in 1..=ROUNDS {
        let held = tokio::spawn(write(a.url(""), "A", key, TOKEN, Some(HOLD)));
        let deadline = Instant::now() + REACH_UPSTREAM;
        while upstream.in_flight() == 0 {
            if held.is_finished() {
                let answer = held.await.expect("A's write");
                panic!("{backend:?}, key {key}: A's write was answered {} without being held at the upstream", answer.status);
            }
            assert!(
                Instant::now() < deadline,
                "{backend:?}, key {key}: A's write did not reach the upstream within {REACH_UPSTREAM:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A's store connections are closed under it while its write is at the upstream.
        relay.set(RelayMode::Cut);
        tokio::time::sleep(CUT).await;
        relay.set(RelayMode::Pass);
        let next = write(b.url(""), "B", key, TOKEN + 1, None).await;
        answers.push(held.await.expect("A's write"));
        answers.push(next);
        // Checked after every round, so the first round that breaks the order is the one named.
        check_serialized(&spans(&upstream)).unwrap_or_else(|violation| {
            panic!("{backend:?}, round {key}: {violation}; clients saw {answers:?}")
        });
    }

    let forwarded: Vec<u64> = upstream
        .seen()
        .iter()
        .filter_map(|s| s.header("x-seq").and_then(|v| v.parse().ok()))
        .collect();
    for answer in &answers {
        assert!(
            !(200..300).contains(&answer.status) || forwarded.contains(&answer.seq),
            "{backend:?}: {answer:?} got a 2xx but was never forwarded"
        );
    }
    println!(
        "{backend:?}: {} writes over {ROUNDS} keys, answers {:?}, {:?}",
        answers.len(),
        answers
            .iter()
            .map(|a| (a.replica, a.token, a.status))
            .collect::<Vec<_>>(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_cut_store_connection_does_not_let_another_replica_overlap_a_forward() {
    with_namespace(Backend::Postgres, |schema| {
        a_lost_store_connection_does_not_end_a_turn(Backend::Postgres, schema)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_a_cut_store_connection_does_not_let_another_replica_overlap_a_forward() {
    with_namespace(Backend::Redis, |prefix| {
        a_lost_store_connection_does_not_end_a_turn(Backend::Redis, prefix)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_etcd_a_cut_store_connection_does_not_let_another_replica_overlap_a_forward() {
    with_namespace(Backend::Etcd, |prefix| {
        a_lost_store_connection_does_not_end_a_turn(Backend::Etcd, prefix)
    })
    .await;
}
