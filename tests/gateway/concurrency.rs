//! A history check of I1 under concurrency: 200 requests over 20 keys with random tokens and
//! random pauses, all at once. The upstream records what it saw; the test checks, from that record
//! and the clients' own, that no request was forwarded with a token below a token already
//! acknowledged for its key, that every 2xx was forwarded exactly once and every refusal never,
//! and that each key's final mark is the largest token that got a 2xx. Run on a plain fenced route
//! and on an idempotent one, where the advance is made with the intent.

use std::time::{Duration, Instant};

use rand::Rng as _;

use crate::support::gateway::fenced_route;
use crate::support::history::{check_history, ClientRecord, UpstreamRecord};
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

const REQUESTS: u64 = 200;
const KEYS: u64 = 20;
const MAX_TOKEN: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_never_get_a_stale_token_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::RandomDelay(Duration::from_millis(5))).await;
    let routes = fenced_route("acct", &upstream.url(), "enforce", "monotonic");
    check_concurrent_writers(&upstream, &routes).await;
}

/// The same on an idempotent route (a new intent per request), where the fence's advance is made
/// by the idempotency layer together with the intent (in one writer batch on the embedded store).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_idempotent_writers_never_get_a_stale_token_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::RandomDelay(Duration::from_millis(5))).await;
    let routes = format!(
        "{}[routes.idempotency]\nkey = \"{{resource_key}}/{{header:x-seq}}\"\n",
        fenced_route("acct", &upstream.url(), "enforce", "monotonic")
    );
    check_concurrent_writers(&upstream, &routes).await;
    // Every forwarded request went through the intent path: it carries its own stable key.
    for seen in upstream.seen() {
        let key = seen.header("idempotency-key").expect("an idempotency key");
        let seq = seen.header("x-seq").expect("x-seq");
        assert!(key.ends_with(&format!("/{seq}")), "{key} for request {seq}");
    }
}

/// Runs the concurrent writers against a gateway with `routes` (an `acct` route keyed `acct:{id}`)
/// and checks the history.
async fn check_concurrent_writers(upstream: &RecordingUpstream, routes: &str) {
    let gw = TestGateway::start(routes).await;
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|seq| {
            let (key, token, pause) = {
                let mut rng = rand::thread_rng();
                (
                    rng.gen_range(0..KEYS),
                    rng.gen_range(1..=MAX_TOKEN),
                    rng.gen_range(0..3000),
                )
            };
            let url = gw.url(&format!("/acct/{key}"));
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(pause)).await;
                let sent = Instant::now();
                let reply = send(
                    "POST",
                    &url,
                    &[("x-fence", &token.to_string()), ("x-seq", &seq.to_string())],
                    "",
                )
                .await;
                ClientRecord {
                    seq,
                    key,
                    token,
                    sent,
                    answered: Instant::now(),
                    status: reply.status.as_u16(),
                    current: reply.header("x-fence-current").and_then(|v| v.parse().ok()),
                }
            })
        })
        .collect();
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(task.await.expect("client task"));
    }
    let records: Vec<UpstreamRecord> = upstream
        .seen()
        .iter()
        .map(|seen| UpstreamRecord {
            seq: seen
                .header("x-seq")
                .and_then(|v| v.parse().ok())
                .expect("x-seq"),
            key: seen
                .target
                .trim_start_matches("/acct/")
                .parse()
                .expect("key"),
            token: seen.fence().expect("token"),
        })
        .collect();
    check_history(&clients, &records).unwrap_or_else(|violation| panic!("{violation}"));

    let accepted = clients.iter().filter(|c| c.status == 200).count();
    let refused = clients.iter().filter(|c| c.status == 409).count();
    assert!(
        accepted > 0 && refused > 0,
        "the run exercised both outcomes ({accepted} / {refused})"
    );
    for key in 0..KEYS {
        let largest = clients
            .iter()
            .filter(|c| c.key == key && c.status == 200)
            .map(|c| c.token)
            .max();
        let mark = gw
            .store()
            .current(&format!("acct:{key}"))
            .await
            .expect("store answers");
        assert_eq!(
            mark, largest,
            "key {key}: the final mark is the largest acknowledged token"
        );
    }
}

/// The checker itself must be able to fail: a history where a stale token was forwarded after a
/// newer one had been acknowledged is flagged.
#[test]
fn the_history_check_flags_a_stale_forward() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let record = |seq, token, sent, answered, status| ClientRecord {
        seq,
        key: 1,
        token,
        sent: at(sent),
        answered: at(answered),
        status,
        current: None,
    };
    let clients = vec![record(1, 10, 0, 5, 200), record(2, 9, 6, 8, 200)];
    let upstream = vec![
        UpstreamRecord {
            seq: 1,
            key: 1,
            token: 10,
        },
        UpstreamRecord {
            seq: 2,
            key: 1,
            token: 9,
        },
    ];
    let violation = check_history(&clients, &upstream).unwrap_err();
    assert!(violation.contains("token 9"), "{violation}");
    // Overlapping in time, the same two writes are a legal history.
    let overlapping = vec![record(1, 10, 0, 5, 200), record(2, 9, 4, 8, 200)];
    assert!(check_history(&overlapping, &upstream).is_ok());
    // A refusal that was forwarded anyway is flagged too.
    let refused = vec![
        record(1, 10, 0, 5, 200),
        ClientRecord {
            current: Some(10),
            ..record(2, 9, 4, 8, 409)
        },
    ];
    assert!(check_history(&refused, &upstream).is_err());
}
