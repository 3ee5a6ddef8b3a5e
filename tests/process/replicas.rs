//! Several replicas on one shared store: three real gateway processes on one PostgreSQL schema
//! (and, in the Redis test, on one Redis prefix). 16 clients write random tokens to 50 keys through
//! random replicas with random pauses; the upstream records what it received, and the I1 history
//! check runs on that record: no request was forwarded whose token was below a token whose 2xx had
//! already been returned, by any replica, before the request was sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng as _;

use crate::support;
use crate::support::gateway::fenced_route;
use crate::support::history::{check_history, ClientRecord, UpstreamRecord};
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream};

const REPLICAS: usize = 3;
const CLIENTS: u64 = 16;
const REQUESTS_PER_CLIENT: u64 = 30;
const KEYS: u64 = 50;
const MAX_TOKEN: u64 = 60;

/// Starts the replicas on `store_toml`, runs the clients, and checks the history. Returns the
/// largest acknowledged token per key.
async fn replicas_keep_i1(store_toml: &str) -> Vec<Option<u64>> {
    let upstream = RecordingUpstream::start(Behavior::RandomDelay(Duration::from_millis(3))).await;
    let route = fenced_route("acct", &upstream.url(), "enforce", "monotonic");
    let dirs: Vec<_> = (0..REPLICAS)
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    let replicas: Vec<GatewayProcess> = dirs
        .iter()
        .map(|dir| GatewayProcess::start_with_store(dir.path(), store_toml, &route))
        .collect();
    let urls: Arc<Vec<String>> = Arc::new(replicas.iter().map(|r| r.url("")).collect());

    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let urls = Arc::clone(&urls);
            tokio::spawn(async move {
                let mut records = Vec::new();
                for n in 0..REQUESTS_PER_CLIENT {
                    let (replica, key, token, pause) = {
                        let mut rng = rand::thread_rng();
                        (
                            rng.gen_range(0..urls.len()),
                            rng.gen_range(0..KEYS),
                            rng.gen_range(1..=MAX_TOKEN),
                            rng.gen_range(0..2000),
                        )
                    };
                    tokio::time::sleep(Duration::from_micros(pause)).await;
                    let seq = client * 1000 + n;
                    let sent = Instant::now();
                    let reply = send(
                        "PUT",
                        &format!("{}/acct/{key}", urls[replica]),
                        &[("x-fence", &token.to_string()), ("x-seq", &seq.to_string())],
                        "",
                    )
                    .await;
                    records.push(ClientRecord {
                        seq,
                        key,
                        token,
                        sent,
                        answered: Instant::now(),
                        status: reply.status.as_u16(),
                        current: reply.header("x-fence-current").and_then(|v| v.parse().ok()),
                    });
                }
                records
            })
        })
        .collect();
    let mut records = Vec::new();
    for client in clients {
        records.extend(client.await.expect("client"));
    }
    let seen: Vec<UpstreamRecord> = upstream
        .seen()
        .iter()
        .map(|s| UpstreamRecord {
            seq: s
                .header("x-seq")
                .and_then(|v| v.parse().ok())
                .expect("x-seq"),
            key: s.target.trim_start_matches("/acct/").parse().expect("key"),
            token: s.fence().expect("token"),
        })
        .collect();
    check_history(&records, &seen).unwrap_or_else(|violation| panic!("{violation}"));
    let accepted = records.iter().filter(|r| r.status == 200).count();
    assert!(
        accepted > 50 && accepted < records.len(),
        "both outcomes exercised: {accepted} of {}",
        records.len()
    );
    drop(replicas);
    (0..KEYS)
        .map(|key| {
            records
                .iter()
                .filter(|r| r.key == key && r.status == 200)
                .map(|r| r.token)
                .max()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_one_postgres_never_forward_a_stale_token() {
    let schema = unique_schema();
    let store = format!("[store]\nbackend = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\nschema = \"{schema}\"\nmax_connections = 4\n");
    let largest = replicas_keep_i1(&store).await;
    let mut db = <sqlx::PgConnection as sqlx::Connection>::connect(TEST_POSTGRES_URL)
        .await
        .unwrap();
    for (key, largest) in largest.iter().enumerate() {
        let row: Option<(String,)> = sqlx::query_as(&format!(
            "SELECT mark::text FROM {schema}.fence_marks_readable WHERE key = $1"
        ))
        .bind(format!("acct:{key}"))
        .fetch_optional(&mut db)
        .await
        .unwrap();
        assert_eq!(
            row.map(|(m,)| m.parse::<u64>().unwrap()),
            *largest,
            "key {key}: the mark is the largest acknowledged token"
        );
    }
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_one_redis_never_forward_a_stale_token() {
    let prefix = support::redis::unique_prefix();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n",
        support::redis::redis_url()
    );
    let largest = replicas_keep_i1(&store).await;
    let mut redis = support::redis::direct().await;
    for (key, largest) in largest.iter().enumerate() {
        let mark: Option<String> =
            redis::AsyncCommands::get(&mut redis, format!("{prefix}mark:acct:{key}"))
                .await
                .unwrap();
        assert_eq!(
            mark.map(|m| m.parse::<u64>().unwrap()),
            *largest,
            "key {key}: the mark is the largest acknowledged token"
        );
    }
    support::redis::delete_keys(&prefix).await;
}

/// A replica killed in the middle of a forward leaves its key's turn leased in the store: another
/// replica gets the key only once the lease has run out (the route's `timeout` + `store_timeout`
/// + 1 s + `turn_margin`, by the store's clock), never before. The killed replica, restarted on its
/// own state directory, takes its turns back at once: its predecessor is dead, and with it the
/// connection of its forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_forward_keeps_its_key_closed_until_the_turn_lapses() {
    let schema = unique_schema();
    let store = format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\nschema = \"{schema}\"\nturn_margin = \"1s\"\n"
    );
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    // Hold: timeout 2 s + store_timeout 1 s + 1 s teardown = 4 s; leased for 5 s.
    let lease = Duration::from_secs(5);
    // fenced_route sets `timeout = "2s"`.
    let route = fenced_route("acct", &upstream.url(), "enforce", "monotonic").replace(
        "compare = \"monotonic\"",
        "compare = \"monotonic\"\ngate_timeout = \"20s\"\nstore_timeout = \"1s\"",
    );
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let doomed = GatewayProcess::start_with_store(dirs[0].path(), &store, &route);
    let survivor = GatewayProcess::start_with_store(dirs[1].path(), &store, &route);

    // Key 1: the survivor waits for the lease.
    let slow = slow_write(doomed.url("/acct/1"));
    let taken = Instant::now();
    wait_until_in_flight(&upstream, 1).await;
    doomed.kill_9();
    let next = send("PUT", &survivor.url("/acct/1"), &[("x-fence", "2")], "").await;
    let waited = taken.elapsed();
    assert_eq!(next.status, 200, "{:?}", next.body);
    assert!(
        waited >= lease - Duration::from_millis(200),
        "the survivor wrote after {waited:?}, before the killed replica's lease of {lease:?} ran out"
    );
    assert!(
        waited < lease + Duration::from_secs(3),
        "the key stayed closed for {waited:?}"
    );
    let _ = slow.await;

    // Key 2: the restarted replica takes its own turn back at once.
    let doomed = GatewayProcess::start_with_store(dirs[0].path(), &store, &route);
    let held = upstream.in_flight();
    let slow = slow_write(doomed.url("/acct/2"));
    wait_until_in_flight(&upstream, held + 1).await;
    doomed.kill_9();
    let restarted = GatewayProcess::start_with_store(dirs[0].path(), &store, &route);
    let started = Instant::now();
    let next = send("PUT", &restarted.url("/acct/2"), &[("x-fence", "2")], "").await;
    assert_eq!(next.status, 200, "{:?}", next.body);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the restarted replica waited {:?} for its own turn",
        started.elapsed()
    );
    let _ = slow.await;
    drop(survivor);
    drop(restarted);
    drop_schema(&schema).await;
}

/// A write the upstream holds for 10 s, sent in the background.
fn slow_write(url: String) -> tokio::task::JoinHandle<bool> {
    tokio::spawn(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let request = http::Request::put(url)
            .header("x-fence", "1")
            .header(support::DELAY_HEADER, "10000")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        client.request(request).await.is_ok()
    })
}

/// Waits until `count` writes are at the upstream (the newest holds its key's turn).
async fn wait_until_in_flight(upstream: &RecordingUpstream, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.in_flight() < count {
        assert!(
            Instant::now() < deadline,
            "the slow write never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A replica stopped gracefully writes the releases of its ended turns on the way out: another
/// replica then gets the key at once, not after the lease (36 s with these settings' defaults).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_stopped_gracefully_leaves_no_key_closed() {
    let schema = unique_schema();
    let store = format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\nschema = \"{schema}\"\n"
    );
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = fenced_route("acct", &upstream.url(), "enforce", "monotonic");
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let leaving = GatewayProcess::start_with_store(dirs[0].path(), &store, &route);
    let staying = GatewayProcess::start_with_store(dirs[1].path(), &store, &route);
    // Writes through the leaving replica, some after its turn listener is up (their releases
    // then wait for a replica that wants the key).
    for key in 0..20 {
        let reply = send(
            "PUT",
            &leaving.url(&format!("/acct/{key}")),
            &[("x-fence", "1")],
            "",
        )
        .await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        leaving.terminate().success(),
        "the replica did not stop cleanly"
    );
    let started = Instant::now();
    for key in 0..20 {
        let reply = send(
            "PUT",
            &staying.url(&format!("/acct/{key}")),
            &[("x-fence", "2")],
            "",
        )
        .await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the stopped replica's keys stayed closed for {:?}",
        started.elapsed()
    );
    drop(staying);
    drop_schema(&schema).await;
}
