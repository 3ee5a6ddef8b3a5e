//! Several replicas on one shared store: three real gateway processes on one PostgreSQL schema
//! (and, in the Redis test, on one Redis prefix). 16 clients write random tokens to 50 keys through
//! random replicas with random pauses; the upstream records what it received, and the I1 history
//! check runs on that record: no request was forwarded whose token was below a token whose 2xx had
//! already been returned, by any replica, before the request was sent.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng as _;
use support::gateway::fenced_route;
use support::history::{check_history, ClientRecord, UpstreamRecord};
use support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use support::{send, Behavior, GatewayProcess, RecordingUpstream};

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

/// The cross-replica gate is held by a database transaction, so a replica killed in the middle of
/// a forward does not keep its key closed: its connection closes and the lock goes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_forward_does_not_keep_its_key_closed() {
    let schema = unique_schema();
    let store = format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\nschema = \"{schema}\"\n"
    );
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = fenced_route("acct", &upstream.url(), "enforce", "monotonic").replace(
        "compare = \"monotonic\"",
        "compare = \"monotonic\"\ngate_timeout = \"5s\"",
    );
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let doomed = GatewayProcess::start_with_store(dirs[0].path(), &store, &route);
    let survivor = GatewayProcess::start_with_store(dirs[1].path(), &store, &route);
    let slow_url = doomed.url("/acct/1");
    let slow = tokio::spawn(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let request = http::Request::put(slow_url)
            .header("x-fence", "1")
            .header(support::DELAY_HEADER, "10000")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        client.request(request).await.is_ok()
    });
    // Wait until the slow write holds the gate (it has reached the upstream).
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.in_flight() == 0 {
        assert!(
            Instant::now() < deadline,
            "the slow write never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // While the doomed replica forwards, the key is closed on the other replica too.
    let blocked = tokio::time::timeout(
        Duration::from_millis(500),
        send("PUT", &survivor.url("/acct/1"), &[("x-fence", "1")], ""),
    )
    .await;
    assert!(
        blocked.is_err(),
        "the survivor forwarded while the doomed replica held the key"
    );
    doomed.kill_9();
    let started = Instant::now();
    let next = send("PUT", &survivor.url("/acct/1"), &[("x-fence", "1")], "").await;
    assert_eq!(next.status, 200, "{:?}", next.body);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the key stayed closed for {:?}",
        started.elapsed()
    );
    let _ = slow.await;
    drop(survivor);
    drop_schema(&schema).await;
}
