//! The command line as a client of a running gateway's admin listener: `fencegate health` probes
//! it, and `fencegate intents` reconciles through it while that gateway holds the embedded
//! store's file.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::fault_upstream::{FaultyUpstream, UpstreamFault};
use crate::support::process::{binary, Launch};
use crate::support::send;

const TOKEN: &str = "admin-client-test-token-0123456789";

/// How long a gateway that listens may take to answer `/readyz` with 200 (its first store check).
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// `fencegate ARGS --config config`.
fn fencegate(config: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run fencegate")
}

/// `fencegate intents ARGS --config config`, off the runtime's threads; its stdout (it must
/// succeed).
async fn intents(config: &Path, args: &[&str]) -> String {
    let config = config.to_owned();
    let args: Vec<String> = std::iter::once("intents")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = fencegate(&config, &args);
        assert!(
            output.status.success(),
            "fencegate {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8 output")
    })
    .await
    .expect("fencegate intents")
}

/// An idempotent route to `upstream` whose unknown outcomes are held for an operator: a repeat is
/// never sent again until `fencegate intents resolve` records what the provider did.
fn held_route(upstream: &str) -> String {
    format!(
        "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{upstream}\"\ntimeout = \"1s\"\n\n[routes.fence]\nmode = \"off\"\n\n[routes.idempotency]\nheader = \"Idempotency-Key\"\nkey = \"payout:{{id}}\"\non_unknown_outcome = \"hold\"\n"
    )
}

#[test]
fn health_probes_the_running_gateways_admin_listener() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Launch::new().admin(TOKEN, "").start(dir.path(), "");
    let config = dir.path().join("fencegate.toml");
    let admin = gateway.admin.expect("an admin listener").to_string();

    let deadline = Instant::now() + READY_TIMEOUT;
    let ready = loop {
        let output = fencegate(&config, &["health"]);
        if output.status.success() || Instant::now() > deadline {
            break output;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        ready.status.success(),
        "{}",
        String::from_utf8_lossy(&ready.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ready.stdout).trim(), "ready");
    let live = fencegate(&config, &["health", "--live"]);
    assert!(
        live.status.success(),
        "{}",
        String::from_utf8_lossy(&live.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&live.stdout).trim(), "ok");

    // Stopped: nothing answers at the admin address, and the probe says where it looked.
    assert!(gateway.terminate().success());
    for args in [vec!["health"], vec!["health", "--live"]] {
        let down = fencegate(&config, &args);
        let stderr = String::from_utf8_lossy(&down.stderr);
        assert!(!down.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(&admin), "{args:?}: {stderr}");
    }

    // Without [admin] there is nothing to probe, and the command says so.
    let plain = tempfile::tempdir().unwrap();
    let _gateway = Launch::new().start(plain.path(), "");
    let output = fencegate(&plain.path().join("fencegate.toml"), &["health"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("no [admin] section"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intents_reconcile_through_the_admin_api_while_the_gateway_holds_the_store() {
    let upstream = FaultyUpstream::start().await;
    upstream.set(UpstreamFault::NeverAnswer);
    let dir = tempfile::tempdir().unwrap();
    let gateway = Launch::new()
        .admin(TOKEN, "")
        .start(dir.path(), &held_route(&upstream.url()));
    let config = dir.path().join("fencegate.toml");
    let url = gateway.url("/payouts/7");

    // The provider never answers: the outcome is unknown and the intent stays SUBMITTING.
    let first = send("POST", &url, &[], "amount=700").await;
    assert_eq!(first.status, 504, "{:?}", first.body);
    assert_eq!(upstream.arrivals().len(), 1);

    let listed = intents(&config, &["list", "--older-than", "0s"]).await;
    let held: Vec<serde_json::Value> = listed
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(held.len(), 1, "{listed}");
    assert_eq!(held[0]["route"], "payouts", "{listed}");
    assert_eq!(held[0]["state"], "SUBMITTING", "{listed}");
    let key = held[0]["key"].as_str().expect("an intent key").to_owned();
    assert!(key.starts_with("payouts/"), "{key}");

    let resolved = intents(
        &config,
        &["resolve", &key, "--status", "200", "--body", "ok"],
    )
    .await;
    assert_eq!(resolved, format!("resolved {key}\n"));

    // The repeat is answered from the recorded outcome; the provider is not called again.
    let repeat = send("POST", &url, &[], "amount=700").await;
    assert_eq!(repeat.status, 200, "{:?}", repeat.body);
    assert_eq!(&repeat.body[..], b"ok");
    assert_eq!(
        upstream.arrivals().len(),
        1,
        "the repeat reached the upstream"
    );
    assert_eq!(intents(&config, &["list", "--older-than", "0s"]).await, "");
}

#[test]
fn intents_without_an_admin_section_say_how_to_reconcile_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    let _gateway = Launch::new().start(dir.path(), &held_route("http://127.0.0.1:9"));
    let output = fencegate(
        &dir.path().join("fencegate.toml"),
        &["intents", "list", "--older-than", "0s"],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    for part in [
        "a running gateway holds the embedded store",
        "[admin]",
        "stop it",
    ] {
        assert!(stderr.contains(part), "no {part:?} in {stderr}");
    }
}
