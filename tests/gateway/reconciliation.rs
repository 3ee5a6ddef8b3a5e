//! Reconciliation from the command line: `fencegate intents list` shows the intents whose outcome
//! is unknown, `fencegate intents resolve` records what the provider says (replayed afterwards) or
//! releases the intent for a fresh attempt.

use std::process::Command;

use crate::support;
use crate::support::provider::{Fault, Provider};
use crate::support::{send, TestGateway};

fn fencegate(args: &[&str]) -> std::process::Output {
    Command::new(support::process::binary())
        .args(args)
        .output()
        .expect("run fencegate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_intents_are_listed_and_resolved_by_an_operator() {
    let provider = Provider::start(false).await;
    let dir = tempfile::tempdir().unwrap();
    let route = format!(
        "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{}\"\nresource_key = \"payout:{{id}}\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\n",
        provider.url()
    );
    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .start()
        .await;
    provider.fail_next(Fault::Answer500);
    provider.fail_next(Fault::Answer500);
    for id in ["1", "2"] {
        let reply = send(
            "POST",
            &gw.url(&format!("/payouts/{id}")),
            &[("x-fence", "1")],
            "{}",
        )
        .await;
        assert_eq!(reply.status, 500);
    }
    gw.stop().await;

    let config = dir.path().join("fencegate.toml");
    std::fs::write(
        &config,
        support::gateway::config_text(dir.path(), "127.0.0.1:0", &route),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let listed = fencegate(&["intents", "list", "--config", config, "--older-than", "0s"]);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let keys: Vec<&str> = lines.iter().filter_map(|l| l["key"].as_str()).collect();
    assert_eq!(keys, ["payouts/payout:1", "payouts/payout:2"]);
    assert_eq!(lines[0]["state"], "SUBMITTING");
    let none = fencegate(&["intents", "list", "--config", config, "--older-than", "1h"]);
    assert!(
        String::from_utf8_lossy(&none.stdout).trim().is_empty(),
        "nothing is an hour old"
    );

    // The provider's dashboard says payout 1 went through; payout 2 did not.
    let resolved = fencegate(&[
        "intents",
        "resolve",
        "--config",
        config,
        "payouts/payout:1",
        "--status",
        "201",
        "--body",
        "{\"charge\":\"ch_1\"}",
        "--header",
        "content-type: application/json",
    ]);
    assert!(
        resolved.status.success(),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    let released = fencegate(&[
        "intents",
        "resolve",
        "--config",
        config,
        "payouts/payout:2",
        "--release",
    ]);
    assert!(
        released.status.success(),
        "{}",
        String::from_utf8_lossy(&released.stderr)
    );
    let unknown = fencegate(&[
        "intents",
        "resolve",
        "--config",
        config,
        "payouts/payout:9",
        "--release",
    ]);
    assert!(!unknown.status.success());

    let gw = TestGateway::builder(&route)
        .in_dir(dir.path())
        .start()
        .await;
    let replay = send("POST", &gw.url("/payouts/1"), &[("x-fence", "1")], "{}").await;
    assert_eq!(
        (replay.status.as_u16(), &replay.body[..]),
        (201, &b"{\"charge\":\"ch_1\"}"[..])
    );
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("content-type"), Some("application/json"));
    let fresh = send("POST", &gw.url("/payouts/2"), &[("x-fence", "1")], "{}").await;
    assert_eq!(fresh.status, 201);
    assert!(
        fresh.header("idempotent-replayed").is_none(),
        "a released intent is submitted afresh"
    );
    assert_eq!(provider.calls(), 3);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_pruned_after_retention_and_the_key_starts_afresh() {
    let provider = Provider::start(false).await;
    let route = format!(
        "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{}\"\nresource_key = \"payout:{{id}}\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\nretention = \"300ms\"\n",
        provider.url()
    );
    let gw = TestGateway::start(&route).await;
    assert_eq!(
        send("POST", &gw.url("/payouts/1"), &[("x-fence", "1")], "{}")
            .await
            .status,
        201
    );
    assert!(gw
        .intents()
        .get("payouts/payout:1")
        .await
        .unwrap()
        .is_some());
    let replay = send("POST", &gw.url("/payouts/1"), &[("x-fence", "1")], "{}").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    // The test gateways prune every 100 ms: the record is gone soon after its retention.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while gw
        .intents()
        .get("payouts/payout:1")
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the expired record was never pruned"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let after = send("POST", &gw.url("/payouts/1"), &[("x-fence", "1")], "{}").await;
    assert_eq!(after.status, 201);
    assert!(
        after.header("idempotent-replayed").is_none(),
        "past retention the key starts afresh"
    );
    assert_eq!(provider.calls(), 2);
    gw.stop().await;
}
