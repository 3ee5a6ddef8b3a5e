//! Token poisoning: `max_advance` refuses a token too far above its key's mark, and signed tokens
//! refuse anything the lock authority did not sign — on routes and on the claim endpoint, never
//! reaching the store or the upstream.

use std::process::Command;

use fencegate::route::RouteCounters;
use fencegate::token::sign_token;

use crate::support;
use crate::support::gateway::embedded_store;
use crate::support::process::binary;
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream, TestGateway};

const ADMIN_TOKEN: &str = "token-poisoning-admin-0123";

/// A fenced route `docs` at `/docs/{id}`, key `doc:{id}`, with `extra` lines in `[routes.fence]`.
fn docs_route(upstream: &str, mode: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"docs\"\npath = \"/docs/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"doc:{{id}}\"\ntimeout = \"2s\"\n\n[routes.fence]\nmode = \"{mode}\"\n{extra}\n\n"
    )
}

/// A second route writing the same keys without a limit (an operator's bulk path, say).
fn bulk_route(upstream: &str) -> String {
    format!(
        "[[routes]]\nname = \"bulk\"\npath = \"/bulk/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"doc:{{id}}\"\ntimeout = \"2s\"\n\n[routes.fence]\nmode = \"observe\"\n\n"
    )
}

async fn write(url: &str, token: &str) -> support::Reply {
    send("POST", url, &[("x-fence", token)], "body").await
}

#[tokio::test]
async fn max_advance_boundary_on_a_new_key() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&docs_route(&upstream.url(), "enforce", "max_advance = 10")).await;
    let refused = write(&gw.url("/docs/1"), "11").await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.problem_slug(), "fence-too-far-ahead");
    let body = refused.json();
    assert_eq!(body["current_fence"], 0);
    assert_eq!(body["max_advance"], 10);
    assert_eq!(body["fence"], 11);
    assert_eq!(body["key"], "doc:1");
    assert_eq!(refused.header("x-fence-current"), Some("0"));
    assert!(upstream.seen().is_empty(), "a refused token was forwarded");
    assert_eq!(gw.store().current("doc:1").await.unwrap(), None);

    let accepted = write(&gw.url("/docs/1"), "10").await;
    assert_eq!(accepted.status, 200);
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(gw.store().current("doc:1").await.unwrap(), Some(10));
    let counters = &gw.route("docs").counters();
    assert_eq!(RouteCounters::read(&counters.too_far_ahead), 1);
    assert_eq!(RouteCounters::read(&counters.accepted), 1);
}

#[tokio::test]
async fn max_advance_is_measured_from_the_current_mark() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&docs_route(&upstream.url(), "enforce", "max_advance = 10")).await;
    for token in ["10", "20", "30"] {
        assert_eq!(
            write(&gw.url("/docs/2"), token).await.status,
            200,
            "{token}"
        );
    }
    let refused = write(&gw.url("/docs/2"), "41").await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.problem_slug(), "fence-too-far-ahead");
    assert_eq!(refused.json()["current_fence"], 30);
    assert_eq!(write(&gw.url("/docs/2"), "40").await.status, 200);
    // A stale token is still refused as stale, not as too far ahead.
    let stale = write(&gw.url("/docs/2"), "5").await;
    assert_eq!(stale.problem_slug(), "stale-fence");
    assert_eq!(upstream.seen().len(), 4);
}

#[tokio::test]
async fn the_huge_token_attack_is_refused_and_the_key_stays_usable() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&docs_route(
        &upstream.url(),
        "enforce",
        "max_advance = 1000",
    ))
    .await;
    assert_eq!(write(&gw.url("/docs/3"), "7").await.status, 200);
    let attack = write(&gw.url("/docs/3"), "18446744073709551615").await;
    assert_eq!(attack.status, 409);
    assert_eq!(attack.problem_slug(), "fence-too-far-ahead");
    assert_eq!(gw.store().current("doc:3").await.unwrap(), Some(7));
    // The legitimate next holder is not locked out.
    assert_eq!(write(&gw.url("/docs/3"), "8").await.status, 200);
    let fences: Vec<Option<u64>> = upstream.seen().iter().map(|s| s.fence()).collect();
    assert_eq!(fences, vec![Some(7), Some(8)]);
}

#[tokio::test]
async fn a_mark_raised_elsewhere_is_read_from_the_store_before_refusing() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let temp = tempfile::tempdir().unwrap();
    // The cache is off, so the only lower bound the gateway has is 0 and the store must be asked.
    let store = format!("{}cache_capacity = 0\n", embedded_store(temp.path()));
    let routes = format!(
        "{}{}",
        docs_route(&upstream.url(), "enforce", "max_advance = 10"),
        bulk_route(&upstream.url())
    );
    let gw = TestGateway::builder(&routes)
        .in_dir(temp.path())
        .store_toml(&store)
        .start()
        .await;
    assert_eq!(write(&gw.url("/bulk/4"), "1000").await.status, 200);
    assert_eq!(write(&gw.url("/docs/4"), "1010").await.status, 200);
    let refused = write(&gw.url("/docs/4"), "1021").await;
    assert_eq!(refused.problem_slug(), "fence-too-far-ahead");
    assert_eq!(refused.json()["current_fence"], 1010);
    assert_eq!(upstream.seen().len(), 2);
}

#[tokio::test]
async fn observe_mode_forwards_but_never_raises_the_mark() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&docs_route(&upstream.url(), "observe", "max_advance = 10")).await;
    let reply = write(&gw.url("/docs/5"), "18446744073709551615").await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(gw.store().current("doc:5").await.unwrap(), None);
    let counters = &gw.route("docs").counters();
    assert_eq!(RouteCounters::read(&counters.too_far_ahead), 1);
    assert_eq!(RouteCounters::read(&counters.observed_refusals), 1);
}

#[tokio::test]
async fn claims_are_held_to_the_smallest_max_advance() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&docs_route(&upstream.url(), "enforce", "max_advance = 10")).await;
    let claim = |token: &'static str| {
        let url = gw.url("/_fencegate/claim/doc:6");
        async move { send("POST", &url, &[("x-fence", token)], "").await }
    };
    let refused = claim("18446744073709551615").await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.problem_slug(), "fence-too-far-ahead");
    assert_eq!(refused.json()["route"], "_claim");
    assert_eq!(gw.store().current("doc:6").await.unwrap(), None);
    assert_eq!(claim("10").await.status, 200);
    assert_eq!(claim("20").await.status, 200);
    assert_eq!(claim("31").await.status, 409);
    assert_eq!(gw.store().current("doc:6").await.unwrap(), Some(20));
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn refusals_are_counted_in_the_rejection_metric() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::builder(&docs_route(&upstream.url(), "enforce", "max_advance = 10"))
        .admin(ADMIN_TOKEN)
        .start()
        .await;
    assert_eq!(write(&gw.url("/docs/7"), "99").await.status, 409);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let metrics = send(
        "GET",
        &gw.admin_url("/metrics"),
        &[("authorization", &bearer)],
        "",
    )
    .await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(
            "fencegate_fence_rejections_total{reason=\"too_far_ahead\",route=\"docs\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("fencegate_fence_rejections_total{reason=\"unsigned\",route=\"docs\"} 0"),
        "{text}"
    );
}

/// Signed tokens need the secret in the gateway's environment: the real binary, started with it.
struct Signed {
    process: GatewayProcess,
    upstream: RecordingUpstream,
    secret: String,
    _dir: tempfile::TempDir,
}

const SIGNATURE_HEADER: &str = "x-lock-signature";

async fn signed_gateway(variable: &str) -> Signed {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let secret = format!("secret-for-{variable}");
    let extra = format!(
        "signature_secret_env = \"{variable}\"\nsignature_header = \"X-Lock-Signature\"\nmax_advance = 1000000"
    );
    let routes = docs_route(&upstream.url(), "enforce", &extra);
    let process = GatewayProcess::start_with_env(
        dir.path(),
        &embedded_store(dir.path()),
        &routes,
        &[(variable, secret.as_str())],
    );
    Signed {
        process,
        upstream,
        secret,
        _dir: dir,
    }
}

impl Signed {
    fn sign(&self, key: &str, token: u64) -> String {
        sign_token(self.secret.as_bytes(), key, token).unwrap()
    }

    async fn write(&self, id: &str, token: &str, signature: Option<&str>) -> support::Reply {
        let mut headers = vec![("x-fence", token)];
        if let Some(signature) = signature {
            headers.push((SIGNATURE_HEADER, signature));
        }
        send(
            "POST",
            &self.process.url(&format!("/docs/{id}")),
            &headers,
            "body",
        )
        .await
    }
}

#[tokio::test]
async fn signed_tokens_pass_and_forgeries_never_reach_store_or_upstream() {
    let gw = signed_gateway("FENCEGATE_TEST_SECRET_WRITES").await;
    let good = gw.sign("doc:1", 5);
    let accepted = gw.write("1", "5", Some(&good)).await;
    assert_eq!(accepted.status, 200);

    let missing = gw.write("1", "900", None).await;
    assert_eq!(missing.status, 428);
    assert_eq!(missing.problem_slug(), "missing-fence-signature");

    let forgeries = [
        ("garbage", "not-a-signature".to_owned()),
        ("other key", gw.sign("doc:2", 900)),
        ("other token", gw.sign("doc:1", 901)),
        (
            "other secret",
            sign_token(b"guessed", "doc:1", 900).unwrap(),
        ),
    ];
    for (what, signature) in &forgeries {
        let refused = gw.write("1", "900", Some(signature)).await;
        assert_eq!(refused.status, 403, "{what}");
        assert_eq!(refused.problem_slug(), "invalid-fence-signature", "{what}");
    }
    // None of the refused tokens raised the mark: token 6, properly signed, still passes.
    let next = gw.sign("doc:1", 6);
    assert_eq!(gw.write("1", "6", Some(&next)).await.status, 200);
    let fences: Vec<Option<u64>> = gw.upstream.seen().iter().map(|s| s.fence()).collect();
    assert_eq!(fences, vec![Some(5), Some(6)]);
}

#[tokio::test]
async fn claims_need_a_signature_when_a_route_requires_them() {
    let gw = signed_gateway("FENCEGATE_TEST_SECRET_CLAIMS").await;
    let url = gw.process.url("/_fencegate/claim/doc%3A9");
    let unsigned = send("POST", &url, &[("x-fence", "50")], "").await;
    assert_eq!(unsigned.status, 428);
    assert_eq!(unsigned.problem_slug(), "missing-fence-signature");
    let wrong = gw.sign("doc:9", 51);
    let forged = send(
        "POST",
        &url,
        &[("x-fence", "50"), (SIGNATURE_HEADER, &wrong)],
        "",
    )
    .await;
    assert_eq!(forged.status, 403);
    let right = gw.sign("doc:9", 40);
    let claimed = send(
        "POST",
        &url,
        &[("x-fence", "40"), (SIGNATURE_HEADER, &right)],
        "",
    )
    .await;
    assert_eq!(claimed.status, 200);
    assert_eq!(claimed.json()["previous"], serde_json::Value::Null);
    // The refused claims of 50 never reached the store: a signed write at 45 passes.
    let write = gw.sign("doc:9", 45);
    assert_eq!(gw.write("9", "45", Some(&write)).await.status, 200);
    assert_eq!(gw.upstream.seen().len(), 1);
}

fn check_config(dir: &std::path::Path, fence_extra: &str) -> (bool, String) {
    let path = dir.join("poisoning.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:8080\"\n\n{}",
        docs_route("http://127.0.0.1:9000", "enforce", fence_extra)
    );
    std::fs::write(&path, text).unwrap();
    let output = Command::new(binary())
        .args(["check-config", path.to_str().unwrap()])
        .env_remove("FENCEGATE_TEST_SECRET_UNSET")
        .env("FENCEGATE_TEST_SECRET_EMPTY", "")
        .output()
        .expect("run fencegate");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn config_refuses_a_missing_or_empty_secret_and_a_zero_max_advance() {
    let dir = tempfile::tempdir().unwrap();
    for variable in ["FENCEGATE_TEST_SECRET_UNSET", "FENCEGATE_TEST_SECRET_EMPTY"] {
        let (ok, stderr) = check_config(
            dir.path(),
            &format!("signature_secret_env = \"{variable}\""),
        );
        assert!(!ok, "{variable}: accepted");
        assert!(stderr.contains("poisoning.toml"), "{stderr}");
        assert!(stderr.contains("route \"docs\""), "{stderr}");
        assert!(stderr.contains("fence.signature_secret_env"), "{stderr}");
        assert!(stderr.contains(variable), "{stderr}");
    }
    let (ok, stderr) = check_config(dir.path(), "max_advance = 0");
    assert!(!ok, "max_advance = 0 accepted");
    assert!(stderr.contains("fence.max_advance"), "{stderr}");
    let (ok, stderr) = check_config(dir.path(), "max_advance = 1");
    assert!(ok, "max_advance = 1 refused: {stderr}");
    let (ok, stderr) = check_config(dir.path(), "max_advance = -1");
    assert!(!ok, "a negative max_advance accepted");
    assert!(stderr.contains("max_advance"), "{stderr}");
}
