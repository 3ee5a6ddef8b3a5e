//! The real binary on SIGTERM: `/readyz` turns to 503 while it serves on for `drain_delay`, then
//! it stops accepting, finishes what is in flight, exits 0. And with `--log-format json`, its
//! stderr is JSON lines carrying each refusal's context.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::client::answers_within;
use crate::support::gateway::fenced_route;
use crate::support::process::{stderr_path, Launch};
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream, DELAY_HEADER};

/// How long the in-flight request takes at the upstream: long enough to signal in the middle.
const SLOW_REQUEST_MS: u64 = 1500;

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_the_in_flight_request_refuses_new_connections_and_exits_0() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let process = GatewayProcess::start(
        dir.path(),
        &fenced_route("docs", &upstream.url(), "enforce", "monotonic"),
    );
    let addr = process.addr;

    let url = process.url("/docs/1");
    let delay = SLOW_REQUEST_MS.to_string();
    let slow = tokio::spawn(async move {
        send(
            "PUT",
            &url,
            &[("x-fence", "1"), (DELAY_HEADER, delay.as_str())],
            "x",
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.in_flight() == 0 {
        assert!(
            Instant::now() < deadline,
            "the slow request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    process.signal_terminate();

    // The listener closes at once, while the slow request is still being answered.
    let refused = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if TcpStream::connect(addr).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    })
    .await
    .expect("probe task");
    assert!(refused, "new connections were accepted after SIGTERM");
    assert_eq!(
        upstream.in_flight(),
        1,
        "the listener closed while the request was in flight"
    );

    let reply = slow.await.expect("client task");
    assert_eq!(reply.status, 200);
    assert_eq!(&reply.body[..], b"ok");
    let status = tokio::task::spawn_blocking(move || process.wait_exit(Duration::from_secs(10)))
        .await
        .expect("wait task");
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(upstream.abandoned().is_empty());
}

/// With `drain_delay`, SIGTERM turns `/readyz` to 503 at once while the listener keeps taking new
/// connections and serving writes (so a load balancer that checks `/readyz` sends clients
/// elsewhere before anything is refused); the drain begins after the delay, and the process
/// exits 0.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_turns_readyz_to_503_and_keeps_serving_for_the_drain_delay() {
    const DRAIN_DELAY: Duration = Duration::from_secs(3);
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let process = Launch::new()
        .server("drain_delay = \"3s\"")
        .admin("drain-token-0123456789", "")
        .start(
            dir.path(),
            &fenced_route("docs", &upstream.url(), "enforce", "monotonic"),
        );
    let ready = process.admin_url("/readyz");
    assert!(
        answers_within(&ready, 200, Duration::from_secs(5)).await,
        "never ready"
    );

    let signalled = Instant::now();
    process.signal_terminate();
    assert!(
        answers_within(&ready, 503, Duration::from_secs(1)).await,
        "/readyz did not turn to 503 after SIGTERM"
    );
    // Until the delay is nearly over: every write, each on a new connection, is served.
    let mut token = 1;
    while signalled.elapsed() < DRAIN_DELAY - Duration::from_millis(700) {
        let reply = send(
            "PUT",
            &process.url("/docs/1"),
            &[("x-fence", &token.to_string())],
            "x",
        )
        .await;
        assert_eq!(reply.status, 200, "write {token} during the drain delay");
        token += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        token > 10,
        "only {token} writes were tried during the delay"
    );
    let status = tokio::task::spawn_blocking(move || process.wait_exit(Duration::from_secs(10)))
        .await
        .expect("wait task");
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(
        signalled.elapsed() >= DRAIN_DELAY,
        "exited {:?} after SIGTERM, before the drain delay",
        signalled.elapsed()
    );
}

/// A second SIGTERM during the drain delay starts the drain at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_sigterm_cuts_the_drain_delay_short() {
    let dir = tempfile::tempdir().expect("temp dir");
    let process = Launch::new()
        .server("drain_delay = \"60s\"")
        .admin("drain-token-0123456789", "")
        .start(dir.path(), "");
    let ready = process.admin_url("/readyz");
    assert!(
        answers_within(&ready, 200, Duration::from_secs(5)).await,
        "never ready"
    );
    process.signal_terminate();
    assert!(
        answers_within(&ready, 503, Duration::from_secs(1)).await,
        "not 503"
    );
    let signalled = Instant::now();
    process.signal_terminate();
    let status = tokio::task::spawn_blocking(move || process.wait_exit(Duration::from_secs(10)))
        .await
        .expect("wait task");
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(signalled.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread")]
async fn json_log_format_writes_json_lines_with_the_refusals_context() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let process = GatewayProcess::start_logging(
        dir.path(),
        &fenced_route("docs", &upstream.url(), "enforce", "monotonic"),
        &["--log-format", "json"],
        "info",
    );
    let accepted = send("PUT", &process.url("/docs/7"), &[("x-fence", "5")], "x").await;
    assert_eq!(accepted.status, 200);
    let stale = send(
        "PUT",
        &process.url("/docs/7"),
        &[("x-fence", "3"), ("x-request-id", "json-log-1")],
        "x",
    )
    .await;
    assert_eq!(stale.status, 409);
    let status = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .expect("terminate task");
    assert_eq!(status.code(), Some(0), "{status}");

    let text = std::fs::read_to_string(stderr_path(dir.path())).expect("read stderr");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
        })
        .collect();
    assert!(!lines.is_empty(), "no log lines at info");
    // Flat: the event's fields beside timestamp, level and target.
    let refusal = lines
        .iter()
        .find(|line| line["message"] == "refused: stale fencing token")
        .unwrap_or_else(|| panic!("no stale-fence refusal in the log:\n{text}"));
    assert_eq!(refusal["level"], "INFO");
    assert!(refusal.get("fields").is_none(), "{refusal}");
    assert_eq!(refusal["route"], "docs");
    assert_eq!(refusal["key"], "docs:7");
    assert_eq!(refusal["token"], 3);
    assert_eq!(refusal["current"], 5);
    assert_eq!(refusal["request_id"], "json-log-1");
}

/// A SIGTERM that arrives while the gateway is still starting (here: its store does not answer)
/// stops the start and exits 0, even though the store never answers. It used to take the
/// signal's default action, ending the process at once without a word, because the handler was
/// installed only when serving began.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_start_up_is_handled_not_fatal() {
    use crate::support::relay::{Relay, RelayMode};
    let relay = Relay::start(
        crate::support::redis::REDIS_ADDR
            .parse()
            .expect("the Redis address"),
    )
    .await;
    relay.set(RelayMode::Stall);
    let dir = tempfile::tempdir().expect("temp dir");
    let addr = crate::support::process::free_port();
    let prefix = crate::support::redis::unique_prefix();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://{}\"\nkey_prefix = \"{prefix}\"\n",
        relay.addr
    );
    let text = crate::support::gateway::config_text_with_store(
        dir.path(),
        &addr.to_string(),
        &store,
        &fenced_route("docs", "http://127.0.0.1:9", "enforce", "monotonic"),
    );
    let config = dir.path().join("fencegate.toml");
    std::fs::write(&config, text).expect("write config");
    let stderr = std::fs::File::create(stderr_path(dir.path())).expect("stderr file");
    let mut child = std::process::Command::new(crate::support::process::binary())
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start fencegate");
    // Long enough to be past parsing the configuration, into opening the stalled store.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        child.try_wait().expect("poll the child").is_none(),
        "fencegate exited before the signal: {}",
        std::fs::read_to_string(stderr_path(dir.path())).unwrap_or_default()
    );
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    // The store stays stalled: the start must stop on the signal alone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            break status;
        }
        assert!(Instant::now() < deadline, "fencegate did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = std::fs::read_to_string(stderr_path(dir.path())).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(0),
        "a SIGTERM during start-up must be handled (drain, exit 0), not end the process: {status}\n{log}"
    );
    assert!(log.contains("SIGTERM received during start-up"), "{log}");
    relay.set(RelayMode::Pass);
    crate::support::redis::delete_keys(&prefix).await;
}
