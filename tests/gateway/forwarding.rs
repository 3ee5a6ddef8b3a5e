//! Forwarding (docs/design.md §7): what the upstream receives and what the client gets back —
//! hop-by-hop headers removed, `Via` and `Forwarded` added, paths placed below the base path,
//! HTTP/2 from clients, and a 256 MiB upload streamed through the real binary with bounded memory.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::Frame;
use http_body_util::{BodyExt as _, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support::gateway::fenced_route;
use crate::support::{send, send_h2, Behavior, GatewayProcess, RecordingUpstream, TestGateway};

#[tokio::test]
async fn hop_by_hop_headers_never_reach_the_upstream() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&fenced_route(
        "docs",
        &upstream.url(),
        "enforce",
        "monotonic",
    ))
    .await;
    let reply = send(
        "PUT",
        &gw.url("/docs/1"),
        &[
            ("x-fence", "3"),
            ("connection", "x-private, keep-alive"),
            ("x-private", "secret"),
            ("keep-alive", "timeout=9"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic Zm9vOmJhcg=="),
            ("proxy-connection", "keep-alive"),
            ("x-end-to-end", "kept"),
        ],
        "body",
    )
    .await;
    assert_eq!(reply.status, 200);
    let seen = &upstream.seen()[0];
    for name in [
        "x-private",
        "keep-alive",
        "te",
        "proxy-authorization",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
    ] {
        assert!(seen.header(name).is_none(), "{name} reached the upstream");
    }
    assert!(seen
        .header("connection")
        .is_none_or(|v| !v.contains("x-private")));
    assert_eq!(seen.header("x-end-to-end"), Some("kept"));
    assert_eq!(seen.body_len, 4);
    // The upstream's own hop-by-hop headers do not reach the client either.
    assert!(reply.header("x-upstream-hop").is_none());
    assert!(reply.header("keep-alive").is_none());
    assert_eq!(reply.header("x-upstream"), Some("yes"));
    assert_eq!(reply.header("via"), Some("1.1 fencegate"));
}

#[tokio::test]
async fn via_and_forwarded_headers_describe_this_hop_and_spoofs_are_replaced() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&fenced_route(
        "docs",
        &upstream.url(),
        "enforce",
        "monotonic",
    ))
    .await;
    let host = gw.addr.to_string();
    let reply = send(
        "POST",
        &gw.url("/docs/1"),
        &[
            ("x-fence", "1"),
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("via", "1.0 edge"),
        ],
        "",
    )
    .await;
    assert_eq!(reply.status, 200);
    let seen = &upstream.seen()[0];
    let via: Vec<&str> = seen
        .headers
        .get_all("via")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert_eq!(
        via,
        ["1.0 edge", "1.1 fencegate"],
        "this hop is appended to the client's Via"
    );
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(
        seen.header("forwarded"),
        Some(format!("for=127.0.0.1;host=\"{host}\";proto=http").as_str())
    );
    assert_eq!(seen.header("x-forwarded-host"), Some(host.as_str()));
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    assert_eq!(
        seen.header("host"),
        Some(upstream.addr.to_string().as_str())
    );
    assert_eq!(seen.header("x-fence"), Some("1"));
}

#[tokio::test]
async fn path_and_query_go_unchanged_below_the_upstream_base_path() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = format!(
        // File names have suffixes that are part of the name (`format_suffix = "literal"`).
        "[[routes]]\nname = \"files\"\npath = \"/files/{{*rest}}\"\nupstream = \"{}/base/\"\nresource_key = \"file:{{rest}}\"\nformat_suffix = \"literal\"\n",
        upstream.url()
    );
    let gw = TestGateway::start(&route).await;
    let reply = send(
        "POST",
        &gw.url("/files/a/b%20c.txt?v=1&w=%2F"),
        &[("x-fence", "2")],
        "",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        upstream.seen()[0].target,
        "/base/files/a/b%20c.txt?v=1&w=%2F"
    );
    assert_eq!(gw.store().current("file:a/b c.txt").await.unwrap(), Some(2));
}

#[tokio::test]
async fn http2_clients_are_fenced_and_forwarded_over_http1() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&fenced_route("docs", &upstream.url(), "enforce", "strict")).await;
    let ok = send_h2("POST", &gw.url("/docs/1"), &[("x-fence", "5")], "h2").await;
    assert_eq!(ok.status, 200);
    assert_eq!(&ok.body[..], b"ok");
    let stale = send_h2("POST", &gw.url("/docs/1"), &[("x-fence", "5")], "h2").await;
    assert_eq!(stale.status, 409);
    assert_eq!(stale.header("x-fence-current"), Some("5"));
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("via"), Some("2 fencegate"));
    assert_eq!(seen[0].body_len, 2);
}

/// Size of the streamed upload.
const UPLOAD_BYTES: u64 = 256 * 1024 * 1024;
/// The most the gateway's resident memory may grow while streaming it.
const MEMORY_GROWTH_LIMIT_KIB: u64 = 64 * 1024;

#[tokio::test]
async fn a_256_mib_upload_streams_through_with_bounded_memory() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let process = GatewayProcess::start(
        dir.path(),
        // Above the default 10 MiB `max_body`.
        &fenced_route("blobs", &upstream.url(), "enforce", "monotonic").replacen(
            "[routes.fence]",
            "max_body = \"1GiB\"\n\n[routes.fence]",
            1,
        ),
    );
    // Warm up: one small request so pools and buffers exist before measuring.
    assert_eq!(
        send("PUT", &process.url("/blobs/0"), &[("x-fence", "1")], "warm")
            .await
            .status,
        200
    );
    let before = process.memory_kib("VmRSS");

    const CHUNK: usize = 1024 * 1024;
    let chunks = (0..UPLOAD_BYTES / CHUNK as u64)
        .map(|_| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; CHUNK]))));
    let body = StreamBody::new(futures_util::stream::iter(chunks));
    let client = Client::builder(TokioExecutor::new()).build_http::<StreamBody<_>>();
    let request = Request::put(process.url("/blobs/1"))
        .header("x-fence", "2")
        .body(body)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(120), client.request(request))
        .await
        .expect("upload finished in time")
        .expect("gateway answered");
    assert_eq!(response.status(), 200);
    let _ = response.into_body().collect().await;

    let peak = process.memory_kib("VmHWM");
    let seen = upstream.seen_under("/blobs/1");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body_len, UPLOAD_BYTES, "every byte arrived");
    let growth = peak.saturating_sub(before);
    println!("gateway RSS before {before} KiB, peak {peak} KiB, growth {growth} KiB");
    assert!(
        growth < MEMORY_GROWTH_LIMIT_KIB,
        "the gateway grew by {growth} KiB while streaming"
    );
}
