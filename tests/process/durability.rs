//! Marks are durable before a request is forwarded (I2): they survive a clean stop and a `kill -9`
//! sent right after the gateway answered 2xx, with the real binary on the embedded store.

use crate::support;
use crate::support::gateway::fenced_route;
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream};

fn route(upstream: &RecordingUpstream) -> String {
    fenced_route("invoices", &upstream.url(), "enforce", "monotonic")
}

#[tokio::test]
async fn marks_survive_a_clean_restart() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let first = GatewayProcess::start(dir.path(), &route(&upstream));
    assert_eq!(
        send("POST", &first.url("/invoices/1"), &[("x-fence", "7")], "")
            .await
            .status,
        200
    );
    let status = first.terminate();
    assert!(status.success(), "graceful stop exits 0, got {status}");

    let second = GatewayProcess::start(dir.path(), &route(&upstream));
    let zombie = send("POST", &second.url("/invoices/1"), &[("x-fence", "6")], "").await;
    assert_eq!(zombie.status, 409);
    assert_eq!(zombie.header("x-fence-current"), Some("7"));
    assert_eq!(upstream.seen().len(), 1);
}

#[tokio::test]
async fn marks_survive_kill_9_sent_right_after_a_2xx() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    for round in 1..=5u64 {
        let process = GatewayProcess::start(dir.path(), &route(&upstream));
        // Several keys advanced concurrently, so the last answers come from one group commit.
        let writes = (0..8u64).map(|key| {
            let url = process.url(&format!("/invoices/{key}"));
            let token = (round * 100 + key).to_string();
            async move { send("PUT", &url, &[("x-fence", &token)], "").await.status }
        });
        let statuses = futures_util::future::join_all(writes).await;
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
        process.kill_9();

        let restarted = GatewayProcess::start(dir.path(), &route(&upstream));
        for key in 0..8u64 {
            let accepted = round * 100 + key;
            let below = (accepted - 1).to_string();
            let zombie = send(
                "PUT",
                &restarted.url(&format!("/invoices/{key}")),
                &[("x-fence", &below)],
                "",
            )
            .await;
            assert_eq!(
                zombie.status, 409,
                "round {round} key {key}: the mark was lost"
            );
            assert_eq!(
                zombie.header("x-fence-current"),
                Some(accepted.to_string().as_str())
            );
        }
        restarted.kill_9();
    }
}

#[tokio::test]
async fn a_second_gateway_cannot_open_a_store_in_use() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let first = GatewayProcess::start(dir.path(), &route(&upstream));
    let config = dir.path().join("second.toml");
    let text = support::gateway::config_text(
        dir.path(),
        &support::process::free_port().to_string(),
        &route(&upstream),
    );
    std::fs::write(&config, text).unwrap();
    let output = std::process::Command::new(support::process::binary())
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .expect("run a second fencegate");
    assert!(
        !output.status.success(),
        "a second writer on one embedded store must not start"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("another fencegate"), "{stderr}");
    // The first one is unaffected.
    assert_eq!(
        send("POST", &first.url("/invoices/1"), &[("x-fence", "1")], "")
            .await
            .status,
        200
    );
}
