//! Every row of docs/design.md §2 this gateway covers, over real sockets with a recording upstream:
//! for both compare modes and all three fence modes, and a refused request never reaches the
//! upstream.

use std::time::Duration;

use fencegate::route::RouteCounters;

use crate::support;
use crate::support::gateway::fenced_route;
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

const COMPARES: [&str; 2] = ["monotonic", "strict"];

/// A gateway with one route per compare mode, all in `mode`.
async fn gateway(upstream: &RecordingUpstream, mode: &str) -> TestGateway {
    let routes: String = COMPARES
        .iter()
        .map(|compare| fenced_route(compare, &upstream.url(), mode, compare))
        .collect();
    TestGateway::start(&routes).await
}

#[tokio::test]
async fn request_matching_no_route_is_404_and_not_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "enforce").await;
    let reply = send("POST", &gw.url("/nowhere/1"), &[("x-fence", "1")], "").await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.problem_slug(), "no-route");
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn missing_token_is_428_in_enforce_mode_and_not_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "enforce").await;
    for compare in COMPARES {
        let reply = send("POST", &gw.url(&format!("/{compare}/1")), &[], "").await;
        assert_eq!(reply.status, 428, "{compare}");
        assert_eq!(reply.problem_slug(), "missing-fence");
        assert_eq!(reply.json()["route"], compare);
        assert_eq!(
            RouteCounters::read(&gw.route(compare).counters().missing),
            1
        );
    }
    assert!(upstream.seen().is_empty());
}

/// Header fields that are not one plain decimal u64.
const MALFORMED: [&[&str]; 11] = [
    &[""],
    &["+5"],
    &["-5"],
    &["5 6"],
    &["five"],
    &["0x10"],
    &["1,2"],
    &["18446744073709551616"],
    &["99999999999999999999999999"],
    &["5", "6"],
    &["5", "5"],
];

#[tokio::test]
async fn malformed_tokens_are_400_and_not_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "enforce").await;
    for compare in COMPARES {
        for values in MALFORMED {
            let headers: Vec<(&str, &str)> = values.iter().map(|v| ("x-fence", *v)).collect();
            let reply = send("PUT", &gw.url(&format!("/{compare}/1")), &headers, "x").await;
            assert_eq!(reply.status, 400, "{compare} {values:?}");
            assert_eq!(reply.problem_slug(), "invalid-fence", "{values:?}");
        }
    }
    assert!(upstream.seen().is_empty());
    // The largest u64 itself is a valid token.
    let reply = send(
        "PUT",
        &gw.url("/monotonic/max"),
        &[("x-fence", "18446744073709551615")],
        "",
    )
    .await;
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn stale_token_is_409_with_current_mark_and_not_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "enforce").await;
    for compare in COMPARES {
        let url = gw.url(&format!("/{compare}/7"));
        assert_eq!(
            send("POST", &url, &[("x-fence", "10")], "new").await.status,
            200
        );
        let reply = send("POST", &url, &[("x-fence", "9")], "zombie").await;
        assert_eq!(reply.status, 409, "{compare}");
        assert_eq!(reply.problem_slug(), "stale-fence");
        assert_eq!(reply.header("x-fence-current"), Some("10"));
        let body = reply.json();
        assert_eq!(body["current_fence"], 10);
        assert_eq!(body["fence"], 9);
        assert_eq!(body["key"], format!("{compare}:7"));
        assert_eq!(body["status"], 409);
        let seen = upstream.seen_under(&format!("/{compare}/7"));
        assert_eq!(
            seen.len(),
            1,
            "only the accepted write reached the upstream"
        );
        assert_eq!(seen[0].fence(), Some(10));
    }
}

#[tokio::test]
async fn equal_token_passes_monotonic_but_not_strict() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "enforce").await;
    let url = gw.url("/monotonic/1");
    for _ in 0..3 {
        assert_eq!(
            send("PATCH", &url, &[("x-fence", "4")], "").await.status,
            200
        );
    }
    let url = gw.url("/strict/1");
    assert_eq!(
        send("PATCH", &url, &[("x-fence", "4")], "").await.status,
        200
    );
    let again = send("PATCH", &url, &[("x-fence", "4")], "").await;
    assert_eq!(again.status, 409);
    assert_eq!(again.header("x-fence-current"), Some("4"));
    assert_eq!(
        send("PATCH", &url, &[("x-fence", "5")], "").await.status,
        200
    );
    assert_eq!(upstream.seen_under("/monotonic/1").len(), 3);
    assert_eq!(upstream.seen_under("/strict/1").len(), 2);
}

#[tokio::test]
async fn accepted_write_is_forwarded_with_its_token_and_advances_the_mark() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "enforce").await;
    for compare in COMPARES {
        let reply = send(
            "DELETE",
            &gw.url(&format!("/{compare}/5?x=1")),
            &[("x-fence", " 0042 ")],
            "",
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("x-upstream"), Some("yes"));
        assert_eq!(&reply.body[..], b"ok");
        let seen = upstream.seen_under(&format!("/{compare}/5"));
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].target, format!("/{compare}/5?x=1"));
        assert_eq!(
            seen[0].header("x-fence"),
            Some("0042"),
            "the verified header is passed on unchanged"
        );
        assert_eq!(
            gw.store().current(&format!("{compare}:5")).await.unwrap(),
            Some(42)
        );
        let counters = &gw.route(compare).counters();
        assert_eq!(RouteCounters::read(&counters.accepted), 1);
        assert_eq!(RouteCounters::read(&counters.advanced), 1);
    }
}

#[tokio::test]
async fn unfenced_methods_are_proxied_without_a_check() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "enforce").await;
    for compare in COMPARES {
        let url = gw.url(&format!("/{compare}/3"));
        assert_eq!(
            send("POST", &url, &[("x-fence", "8")], "").await.status,
            200
        );
        assert_eq!(send("GET", &url, &[], "").await.status, 200);
        assert_eq!(send("GET", &url, &[("x-fence", "1")], "").await.status, 200);
        assert_eq!(
            send("HEAD", &url, &[("x-fence", "junk")], "").await.status,
            200
        );
    }
    assert_eq!(upstream.seen().len(), 8);
}

#[tokio::test]
async fn observe_mode_forwards_everything_and_counts_what_enforce_would_refuse() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "observe").await;
    for compare in COMPARES {
        let url = gw.url(&format!("/{compare}/1"));
        assert_eq!(
            send("POST", &url, &[("x-fence", "10")], "").await.status,
            200
        );
        assert_eq!(
            send("POST", &url, &[("x-fence", "9")], "").await.status,
            200,
            "stale"
        );
        assert_eq!(send("POST", &url, &[], "").await.status, 200, "missing");
        assert_eq!(
            send("POST", &url, &[("x-fence", "-1")], "").await.status,
            200,
            "invalid"
        );
        assert_eq!(upstream.seen_under(&format!("/{compare}/1")).len(), 4);
        let counters = &gw.route(compare).counters();
        assert_eq!(RouteCounters::read(&counters.observed_refusals), 3);
        assert_eq!(RouteCounters::read(&counters.stale), 1);
        assert_eq!(RouteCounters::read(&counters.missing), 1);
        assert_eq!(RouteCounters::read(&counters.invalid), 1);
        // Observe still records generations, so switching to enforce starts from real marks.
        assert_eq!(
            gw.store().current(&format!("{compare}:1")).await.unwrap(),
            Some(10)
        );
    }
}

#[tokio::test]
async fn off_mode_is_a_plain_proxy_route() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "off").await;
    for compare in COMPARES {
        let url = gw.url(&format!("/{compare}/1"));
        assert_eq!(
            send("POST", &url, &[("x-fence", "10")], "").await.status,
            200
        );
        assert_eq!(
            send("POST", &url, &[("x-fence", "9")], "").await.status,
            200
        );
        assert_eq!(send("POST", &url, &[], "").await.status, 200);
        assert_eq!(
            send("POST", &url, &[("x-fence", "x"), ("x-fence", "y")], "")
                .await
                .status,
            200
        );
        assert_eq!(
            gw.store().current(&format!("{compare}:1")).await.unwrap(),
            None
        );
    }
    assert_eq!(upstream.seen().len(), 8);
}

#[tokio::test]
async fn refused_upstream_connection_is_502() {
    let closed = support::process::free_port();
    let routes: String = COMPARES
        .iter()
        .map(|c| fenced_route(c, &format!("http://{closed}"), "enforce", c))
        .collect();
    let gw = TestGateway::start(&routes).await;
    for compare in COMPARES {
        let reply = send(
            "POST",
            &gw.url(&format!("/{compare}/1")),
            &[("x-fence", "1")],
            "",
        )
        .await;
        assert_eq!(reply.status, 502, "{compare}");
        assert_eq!(reply.problem_slug(), "upstream-unavailable");
    }
}

#[tokio::test]
async fn upstream_slower_than_the_route_timeout_is_504() {
    let upstream = RecordingUpstream::start(Behavior::Delay(Duration::from_secs(3))).await;
    let gw = gateway(&upstream, "enforce").await; // route timeout: 2s
    let started = std::time::Instant::now();
    let reply = send("POST", &gw.url("/strict/1"), &[("x-fence", "1")], "").await;
    assert_eq!(reply.status, 504);
    assert_eq!(reply.problem_slug(), "upstream-timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered at the timeout, not after the upstream"
    );
}

#[tokio::test]
async fn paths_with_dot_segments_are_refused() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream, "enforce").await;
    for path in [
        "/strict/../monotonic/1",
        "/strict/%2e%2e/monotonic/1",
        "/strict/./1",
    ] {
        let reply = send("POST", &gw.url(path), &[("x-fence", "1")], "").await;
        assert_eq!(reply.status, 400, "{path}");
        assert_eq!(reply.problem_slug(), "invalid-path");
    }
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn resource_key_from_a_missing_header_is_400() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = format!(
        "[[routes]]\nname = \"tenant\"\npath = \"/docs/{{id}}\"\nupstream = \"{}\"\nresource_key = \"doc:{{header:X-Tenant}}:{{id}}\"\n",
        upstream.url()
    );
    let gw = TestGateway::start(&route).await;
    let reply = send("POST", &gw.url("/docs/1"), &[("x-fence", "1")], "").await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.problem_slug(), "invalid-resource-key");
    let ok = send(
        "POST",
        &gw.url("/docs/1"),
        &[("x-fence", "1"), ("x-tenant", "acme")],
        "",
    )
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(gw.store().current("doc:acme:1").await.unwrap(), Some(1));
    assert_eq!(upstream.seen().len(), 1);
}
