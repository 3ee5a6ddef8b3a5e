//! Resource bounds of the data plane: a route's `max_body` (413, before the fence when
//! `Content-Length` says so, mid-stream for chunked bodies), the header-count limit (431; the
//! head-size limit is a case of `malformed_http.rs`), and `max_connections` (503 and close).

use std::time::Duration;

use tokio::net::TcpStream;

use crate::support::raw::exchange;
use crate::support::upstream::{Behavior, RecordingUpstream};
use crate::support::{send, send_h2, TestGateway};

const TOKEN: &str = "limits-admin-token-0123456789";

fn route(upstream: &str) -> String {
    format!(
        "[[routes]]\nname = \"inv\"\npath = \"/inv/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"inv:{{id}}\"\nmax_body = \"1KiB\"\n\n"
    )
}

#[tokio::test]
async fn a_declared_body_over_max_body_is_refused_before_the_fence_advances() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&route(&upstream.url())).await;
    let too_big = "x".repeat(1025);
    let refused = send("POST", &gw.url("/inv/1"), &[("x-fence", "5")], &too_big).await;
    assert_eq!(refused.status, 413);
    assert_eq!(refused.problem_slug(), "body-too-large");
    assert!(upstream.seen().is_empty());
    assert_eq!(
        gw.store().current("inv:1").await.expect("store answers"),
        None,
        "the refused request did not advance the mark"
    );
    // Exactly the limit passes, and a lower token still does: the mark never saw 5.
    let fits = "x".repeat(1024);
    let passed = send("POST", &gw.url("/inv/1"), &[("x-fence", "3")], &fits).await;
    assert_eq!(passed.status, 200);
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(upstream.seen()[0].body_len, 1024);
}

#[tokio::test]
async fn max_body_holds_for_http2_requests_too() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&route(&upstream.url())).await;
    let too_big = "x".repeat(2048);
    let refused = send_h2("POST", &gw.url("/inv/1"), &[("x-fence", "5")], &too_big).await;
    assert_eq!(refused.status, 413);
    assert_eq!(refused.problem_slug(), "body-too-large");
    assert!(upstream.seen().is_empty());
    let fits = send_h2("POST", &gw.url("/inv/1"), &[("x-fence", "3")], "small").await;
    assert_eq!(fits.status, 200);
    assert_eq!(upstream.seen().len(), 1);
}

#[tokio::test]
async fn a_chunked_body_growing_past_max_body_is_cut_off_with_413() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&route(&upstream.url())).await;
    let mut request =
        b"POST /inv/1 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..4 {
        request.extend_from_slice(b"3e8\r\n");
        request.extend_from_slice(&[b'c'; 1000]);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let answer = exchange(gw.addr, &request).await;
    assert_eq!(answer.status(), Some(413), "{:?}", answer.text());
    assert!(answer.text().contains("/problems/body-too-large\""));
    // The forward was aborted: whatever reached the upstream stopped at the limit.
    for seen in upstream.seen() {
        assert!(
            seen.body_len <= 1024,
            "upstream got {} bytes",
            seen.body_len
        );
    }
    let after = send("POST", &gw.url("/inv/2"), &[("x-fence", "1")], "small").await;
    assert_eq!(after.status, 200, "the gateway still serves");
}

#[tokio::test]
async fn too_many_header_fields_get_431() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::builder(&route(&upstream.url()))
        .server_options("max_headers = 8")
        .start()
        .await;
    let head = |extra: usize| {
        let mut request =
            b"POST /inv/1 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nConnection: close\r\nContent-Length: 0\r\n"
                .to_vec();
        for i in 0..extra {
            request.extend_from_slice(format!("X-Extra-{i}: {i}\r\n").as_bytes());
        }
        request.extend_from_slice(b"\r\n");
        request
    };
    let refused = exchange(gw.addr, &head(6)).await;
    assert_eq!(refused.statuses(), [431], "{:?}", refused.text());
    assert!(upstream.seen().is_empty());
    let within = exchange(gw.addr, &head(4)).await;
    assert_eq!(within.statuses(), [200], "{:?}", within.text());
    assert_eq!(upstream.seen().len(), 1);
}

/// The default (100, hyper's own limit, which the server leaves implicit) holds exactly. The
/// test upstream has hyper's limit too and the gateway adds its forwarding headers, so the check
/// is whether a head got past the gateway's own parser: then its answer (whatever the upstream
/// made of it) carries the request id the gateway assigns; a head the gateway's parser refuses
/// never reaches the service that assigns it.
#[tokio::test]
async fn the_default_header_field_limit_is_100() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::builder(&route(&upstream.url()))
        .server_options("")
        .start()
        .await;
    let head = |fields: usize| {
        let mut request = b"GET /inv/1 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n".to_vec();
        for i in 2..fields {
            request.extend_from_slice(format!("X-Extra-{i}: {i}\r\n").as_bytes());
        }
        request.extend_from_slice(b"\r\n");
        request
    };
    let at_limit = exchange(gw.addr, &head(100)).await;
    assert!(
        at_limit.text().contains("x-request-id: "),
        "100 fields pass the gateway: {:?}",
        at_limit.text()
    );
    let over = exchange(gw.addr, &head(101)).await;
    assert_eq!(over.statuses(), [431], "{:?}", over.text());
    assert!(
        !over.text().contains("x-request-id"),
        "101 fields are refused by the gateway itself: {:?}",
        over.text()
    );
}

/// `fencegate_connections_refused_total` as the admin listener reports it.
async fn refused_connections(gw: &TestGateway) -> u64 {
    let auth = format!("Bearer {TOKEN}");
    let metrics = send(
        "GET",
        &gw.admin_url("/metrics"),
        &[("authorization", auth.as_str())],
        "",
    )
    .await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix("fencegate_connections_refused_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no refused-connections counter in {text}"))
}

#[tokio::test]
async fn connections_over_max_connections_get_a_503_and_are_closed() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let routes = format!(
        "{}[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n",
        route(&upstream.url())
    );
    let gw = TestGateway::builder(&routes)
        .server_options("max_connections = 2")
        .start()
        .await;
    assert_eq!(refused_connections(&gw).await, 0);
    // Two idle connections take both places (the listener accepts in connection order).
    let first = TcpStream::connect(gw.addr).await.expect("connect");
    let second = TcpStream::connect(gw.addr).await.expect("connect");
    let request =
        b"POST /inv/1 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    let refused = exchange(gw.addr, request).await;
    let text = refused.text();
    assert_eq!(refused.statuses(), [503], "{text:?}");
    assert!(text.contains("\r\nconnection: close\r\n"), "{text:?}");
    assert!(text.contains("\r\nretry-after: 1\r\n"), "{text:?}");
    assert!(
        text.contains("/problems/too-many-connections\""),
        "{text:?}"
    );
    assert!(upstream.seen().is_empty());
    assert_eq!(refused_connections(&gw).await, 1);
    // Once a place is free again, new connections are served.
    drop(first);
    let mut served = None;
    for _ in 0..200 {
        let answer = exchange(gw.addr, request).await;
        if answer.status() == Some(200) {
            served = Some(answer);
            break;
        }
        // The gateway has not yet noticed the closed connection; ask again shortly.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        served.is_some(),
        "a freed place is given to a new connection"
    );
    assert_eq!(upstream.seen().len(), 1);
    drop(second);
}
