//! The admin listener: Prometheus metrics (checked with a real parser, `promtool check metrics`),
//! health and readiness, bearer-token auth, reading and raising marks (never lowering them),
//! routes and intents.

use crate::support;
use crate::support::gateway::fenced_route;
use crate::support::promtool::promtool_check;
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

const TOKEN: &str = "test-admin-token-0123456789";

fn bearer() -> (&'static str, String) {
    ("authorization", format!("Bearer {TOKEN}"))
}

async fn admin_get(gw: &TestGateway, path: &str) -> support::Reply {
    let (name, value) = bearer();
    send("GET", &gw.admin_url(path), &[(name, &value)], "").await
}

/// A gateway with the fenced route `inv` to `upstream` and an admin listener with [`TOKEN`].
async fn fenced_with_admin(upstream: &RecordingUpstream) -> TestGateway {
    fenced_with_admin_toml(upstream, "").await
}

/// Like [`fenced_with_admin`], with `options` (TOML lines) in the `[admin]` table.
async fn fenced_with_admin_toml(upstream: &RecordingUpstream, options: &str) -> TestGateway {
    let route = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let admin = format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n{options}\n");
    TestGateway::builder(&route)
        .admin_toml(&admin)
        .start()
        .await
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

#[tokio::test]
async fn metrics_parse_and_move_as_requests_are_refused() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = fenced_with_admin(&upstream).await;
    let before = send("GET", &gw.admin_url("/metrics"), &[], "").await;
    assert_eq!(before.status, 200, "metrics need no token by default");
    let before = String::from_utf8(before.body.to_vec()).unwrap();
    promtool_check(&before);
    assert!(before.contains("fencegate_build_info{version=\"0.1.0\"} 1"));

    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "10")], "")
            .await
            .status,
        200
    );
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "9")], "")
            .await
            .status,
        409
    );
    assert_eq!(send("POST", &gw.url("/inv/1"), &[], "").await.status, 428);
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "x")], "")
            .await
            .status,
        400
    );
    let after = String::from_utf8(
        send("GET", &gw.admin_url("/metrics"), &[], "")
            .await
            .body
            .to_vec(),
    )
    .unwrap();
    promtool_check(&after);
    for reason in ["stale", "missing", "invalid"] {
        let series =
            format!("fencegate_fence_rejections_total{{reason=\"{reason}\",route=\"inv\"}}");
        assert_eq!(
            sample(&after, &series) - sample(&before, &series),
            1.0,
            "{series}"
        );
    }
    assert_eq!(
        sample(&after, "fencegate_fence_advances_total{route=\"inv\"}"),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            "fencegate_requests_total{outcome=\"refused\",route=\"inv\"}"
        ),
        3.0
    );
    assert_eq!(
        sample(
            &after,
            "fencegate_requests_total{outcome=\"forwarded\",route=\"inv\"}"
        ),
        1.0
    );
    // The stale token was refused from the cache: one advance reached the store. The ordering
    // gate's re-read of the mark did not: this gateway is the embedded store's only writer, so
    // its cache holds the exact mark.
    let store_ops = |op: &str| {
        sample(&after, &format!("fencegate_store_operation_duration_seconds_count{{backend=\"embedded\",op=\"{op}\"}}"))
    };
    assert_eq!((store_ops("advance"), store_ops("current")), (1.0, 0.0));
    assert_eq!(
        sample(
            &after,
            "fencegate_upstream_request_duration_seconds_count{route=\"inv\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            "fencegate_gate_wait_duration_seconds_count{route=\"inv\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(&after, "fencegate_inflight_requests{route=\"inv\"}"),
        0.0
    );
    assert!(
        !after.contains("inv:1"),
        "metrics are never labelled by resource key"
    );
}

#[tokio::test]
async fn health_readiness_and_auth() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = fenced_with_admin(&upstream).await;
    assert_eq!(
        send("GET", &gw.admin_url("/healthz"), &[], "").await.status,
        200
    );
    assert_eq!(
        send("GET", &gw.admin_url("/readyz"), &[], "").await.status,
        200
    );
    let anonymous = send("GET", &gw.admin_url("/admin/routes"), &[], "").await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    // Admin failures are problem details, like the data plane's.
    assert_eq!(
        anonymous.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        anonymous.json()["type"],
        "https://fencegate.dev/problems/unauthorized"
    );
    let wrong = send(
        "GET",
        &gw.admin_url("/admin/routes"),
        &[("authorization", "Bearer nope")],
        "",
    )
    .await;
    assert_eq!(wrong.status, 401);
    let routes = admin_get(&gw, "/admin/routes").await;
    assert_eq!(routes.status, 200);
    assert_eq!(routes.json()["routes"][0]["name"], "inv");
    assert_eq!(routes.json()["routes"][0]["fence"]["ordering"], "serialize");
}

#[tokio::test]
async fn marks_are_read_and_raised_but_never_lowered() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = fenced_with_admin(&upstream).await;
    assert_eq!(admin_get(&gw, "/admin/fences/inv:1").await.status, 404);
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "7")], "")
            .await
            .status,
        200
    );
    let read = admin_get(&gw, "/admin/fences/inv:1").await;
    assert_eq!(read.json(), serde_json::json!({"key": "inv:1", "fence": 7}));

    let (name, value) = bearer();
    let headers = [(name, value.as_str()), ("content-type", "application/json")];
    let raised = send(
        "PUT",
        &gw.admin_url("/admin/fences/inv:1"),
        &headers,
        "{\"fence\": 9}",
    )
    .await;
    assert_eq!(raised.status, 200);
    assert_eq!(raised.json()["previous"], 7);
    let lowered = send(
        "PUT",
        &gw.admin_url("/admin/fences/inv:1"),
        &headers,
        "{\"fence\": 3}",
    )
    .await;
    assert_eq!(lowered.status, 409, "marks never go down (I3)");
    assert_eq!(
        lowered.json()["type"],
        "https://fencegate.dev/problems/marks-never-go-down"
    );
    assert_eq!(lowered.json()["current_fence"], 9);
    assert_eq!(lowered.json()["key"], "inv:1");
    assert_eq!(
        admin_get(&gw, "/admin/fences/inv:1").await.json()["fence"],
        9
    );
    // The raised mark fences the data plane at once.
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &[("x-fence", "8")], "")
            .await
            .status,
        409
    );
    let anonymous = send(
        "PUT",
        &gw.admin_url("/admin/fences/inv:1"),
        &[("content-type", "application/json")],
        "{\"fence\": 99}",
    )
    .await;
    assert_eq!(anonymous.status, 401);
}

#[tokio::test]
async fn intents_are_listed_for_reconciliation() {
    let provider = support::provider::Provider::start(false).await;
    let route = format!(
        "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{}\"\nresource_key = \"payout:{{id}}\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\n",
        provider.url()
    );
    let gw = TestGateway::builder(&route).admin(TOKEN).start().await;
    provider.fail_next(support::provider::Fault::Answer500);
    assert_eq!(
        send("POST", &gw.url("/payouts/1"), &[("x-fence", "1")], "{}")
            .await
            .status,
        500
    );
    let listed = admin_get(&gw, "/admin/intents?state=submitting&older_than=0s").await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json()["intents"][0]["key"], "payouts/payout:1");
    assert_eq!(listed.json()["intents"][0]["state"], "SUBMITTING");
    let none = admin_get(&gw, "/admin/intents?state=submitting&older_than=1h").await;
    assert_eq!(none.json()["intents"].as_array().map(Vec::len), Some(0));
    assert_eq!(
        admin_get(&gw, "/admin/intents?state=completed")
            .await
            .status,
        400
    );
}

#[tokio::test]
async fn probes_can_require_the_token_too() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = fenced_with_admin_toml(&upstream, "probes_require_token = true\n").await;
    for probe in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(
            send("GET", &gw.admin_url(probe), &[], "").await.status,
            401,
            "{probe}"
        );
        assert_eq!(admin_get(&gw, probe).await.status, 200, "{probe}");
    }
}

#[tokio::test]
async fn every_admin_endpoint_refuses_a_missing_or_wrong_token() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = fenced_with_admin_toml(&upstream, "probes_require_token = true\n").await;
    let endpoints = [
        ("GET", "/admin/fences/inv:1", ""),
        ("PUT", "/admin/fences/inv:1", "{\"fence\": 99}"),
        ("GET", "/admin/routes", ""),
        ("GET", "/admin/intents", ""),
        ("POST", "/admin/reload", ""),
        ("GET", "/metrics", ""),
        ("GET", "/healthz", ""),
        ("GET", "/readyz", ""),
    ];
    let wrong = [
        None,
        Some("Bearer nope".to_owned()),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
        Some(format!("Basic {TOKEN}")),
        Some(TOKEN.to_owned()),
    ];
    for (method, path, body) in endpoints {
        for credential in &wrong {
            let mut headers = vec![("content-type", "application/json")];
            if let Some(credential) = credential {
                headers.push(("authorization", credential.as_str()));
            }
            let reply = send(method, &gw.admin_url(path), &headers, body).await;
            assert_eq!(reply.status, 401, "{method} {path} with {credential:?}");
        }
    }
    // None of the refused calls did anything.
    assert_eq!(admin_get(&gw, "/admin/fences/inv:1").await.status, 404);
}

/// A request whose client goes away before the answer leaves the in-flight gauge as it found it:
/// hyper drops the request's future, and the gauge is a guard dropped with it. Before, it was
/// decremented only when the future ran to its end, so every abandoned request stayed counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_request_leaves_the_in_flight_gauge() {
    use tokio::io::AsyncWriteExt as _;
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = fenced_with_admin(&upstream).await;
    let series = "fencegate_inflight_requests{route=\"inv\"}";
    let gauge = || async {
        let text = send("GET", &gw.admin_url("/metrics"), &[], "").await.body;
        sample(&String::from_utf8_lossy(&text), series)
    };
    let addr = gw
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut client = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request = format!(
        "POST /inv/1 HTTP/1.1\r\nHost: {addr}\r\nX-Fence: 1\r\n{}: 2000\r\nContent-Length: 0\r\n\r\n",
        support::DELAY_HEADER
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while upstream.in_flight() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(gauge().await, 1.0, "counted while in flight");
    drop(client);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while gauge().await != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned request is still counted in flight"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
