//! Malformed HTTP written byte for byte to a real gateway in front of a recording upstream.
//!
//! 33 cases. Refused with a 4xx, nothing forwarded, the gateway still serving afterwards (29):
//! the gateway answers 400 `ambiguous-framing` for `Content-Length` with `Transfer-Encoding`, in
//! either order, and for a `Transfer-Encoding` other than one `chunked` (a coding before it,
//! `chunked` twice, a coding and `chunked` on two lines); hyper's parser answers 400 (or 431) and closes for two different
//! `Content-Length`s, a `Content-Length` list with two values, a signed `Content-Length`, a
//! `Transfer-Encoding` that is not chunked, `Transfer-Encoding` on HTTP/1.0, obsolete line folding,
//! a space before a header's colon, a NUL byte in a header value, a head over `max_header_bytes`
//! (431), a raw non-UTF-8 byte in the path and one in a header name; the gateway's router answers
//! 400 `invalid-path` for `/../`, `/%2e%2e/`, `/.%2E/`, `/./`, `..%2F`, `..%5C`, a raw backslash,
//! an encoded slash in a key segment, `%00`, a 600-byte key segment and a key segment that is not
//! UTF-8 once decoded, and 404 for an empty key segment (`/inv/` is `/inv`: a trailing slash is
//! ignored); the fence answers 400 for a non-UTF-8 `X-Fence`.
//!
//! Smuggling attempts (4), never turned into an upstream request that was not sent as one: a
//! request with both `Content-Length` and `Transfer-Encoding: chunked` followed by a second
//! request, in either header order, is refused and its connection closed, so neither reaches the
//! upstream; on a kept-alive connection, requests framed by length and by chunks (one with an
//! ambiguous head as its body text) are forwarded and only the ambiguous one after them is refused;
//! a request hidden inside a body is forwarded as that body and nothing else.
//!
//! Requests an upstream framework would read another way than the gateway (methods in another
//! letter case, overrides, `CONNECT`, hosts, `;` parameters, double escapes, format suffixes, the
//! reserved prefix, collections, WebDAV destinations) get their problem type and reach nothing;
//! what is forwarded is the canonical path that matched, and a canonical `Destination`.

use crate::support::raw::exchange;
use crate::support::upstream::{Behavior, RecordingUpstream};
use crate::support::{send, TestGateway};

/// The routes under test: a fenced one, and an unfenced catch-all a path escape would aim from.
fn routes(upstream: &str) -> String {
    format!(
        "[[routes]]\nname = \"inv\"\npath = \"/inv/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"inv:{{id}}\"\n\n\
         [[routes]]\nname = \"public\"\npath = \"/public/{{*rest}}\"\nupstream = \"{upstream}\"\n\n[routes.fence]\nmode = \"off\"\n\n"
    )
}

/// A `POST` with the given target and extra header lines, closing the connection after it.
fn post(target: &[u8], headers: &[u8]) -> Vec<u8> {
    let mut request = b"POST ".to_vec();
    request.extend_from_slice(target);
    request.extend_from_slice(b" HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nConnection: close\r\n");
    request.extend_from_slice(headers);
    request.extend_from_slice(b"\r\n");
    request
}

struct Case {
    name: &'static str,
    request: Vec<u8>,
    status: u16,
    /// The problem type the gateway answers with, when the gateway (not hyper) refuses.
    slug: Option<&'static str>,
}

fn refused_cases() -> Vec<Case> {
    let case = |name, request, status, slug| Case {
        name,
        request,
        status,
        slug,
    };
    let long_segment = format!("/inv/{}", "k".repeat(600));
    let big_header = format!("X-Padding: {}\r\n", "p".repeat(9 * 1024));
    let with_chunked_body = |head: &[u8]| {
        let mut request = post(b"/inv/1", head);
        request.extend_from_slice(b"3\r\nabc\r\n0\r\n\r\n");
        request
    };
    vec![
        case(
            "Content-Length, then Transfer-Encoding",
            with_chunked_body(b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n"),
            400,
            Some("ambiguous-framing"),
        ),
        case(
            "Transfer-Encoding, then Content-Length",
            with_chunked_body(b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n"),
            400,
            Some("ambiguous-framing"),
        ),
        case(
            "two different Content-Lengths",
            post(b"/inv/1", b"Content-Length: 3\r\nContent-Length: 4\r\n"),
            400,
            None,
        ),
        case(
            "a Content-Length list",
            post(b"/inv/1", b"Content-Length: 3, 4\r\n"),
            400,
            None,
        ),
        case(
            "a signed Content-Length",
            post(b"/inv/1", b"Content-Length: +3\r\n"),
            400,
            None,
        ),
        case(
            "Transfer-Encoding that is not chunked",
            post(b"/inv/1", b"Transfer-Encoding: gzip\r\n"),
            400,
            None,
        ),
        case(
            "a coding before chunked",
            with_chunked_body(b"Transfer-Encoding: gzip, chunked\r\n"),
            400,
            Some("ambiguous-framing"),
        ),
        case(
            "chunked twice",
            with_chunked_body(b"Transfer-Encoding: chunked, chunked\r\n"),
            400,
            Some("ambiguous-framing"),
        ),
        case(
            "a coding, then chunked on a second line",
            with_chunked_body(b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"),
            400,
            Some("ambiguous-framing"),
        ),
        case(
            "Transfer-Encoding on HTTP/1.0",
            b"POST /inv/1 HTTP/1.0\r\nX-Fence: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                .to_vec(),
            400,
            None,
        ),
        case(
            "obsolete line folding",
            post(b"/inv/1", b"X-Note: one\r\n two\r\n"),
            400,
            None,
        ),
        case(
            "a space before the colon",
            post(b"/inv/1", b"X-Note : one\r\n"),
            400,
            None,
        ),
        case(
            "a NUL byte in a header value",
            post(b"/inv/1", b"X-Note: a\x00b\r\n"),
            400,
            None,
        ),
        case(
            "a head over max_header_bytes",
            post(b"/inv/1", big_header.as_bytes()),
            431,
            None,
        ),
        case(
            "a raw non-UTF-8 byte in the path",
            post(b"/inv/\xff\xfe", b""),
            400,
            None,
        ),
        case(
            "a non-UTF-8 header name",
            post(b"/inv/1", b"X-\xffName: 1\r\n"),
            400,
            None,
        ),
        case(
            "a dot-dot segment",
            post(b"/public/../inv/1", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "an encoded dot-dot segment",
            post(b"/public/%2e%2e/inv/1", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "a half-encoded dot-dot segment",
            post(b"/public/.%2E/inv/1", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "a dot segment",
            post(b"/public/./x", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "dot-dot and an encoded slash",
            post(b"/public/..%2Finv%2F1", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "dot-dot and an encoded backslash",
            post(b"/public/..%5Cinv%5C1", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "a raw backslash",
            post(b"/public/..\\inv\\1", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "an encoded slash in a key segment",
            post(b"/inv/a%2Fb", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "an encoded NUL",
            post(b"/inv/a%00", b""),
            400,
            Some("invalid-path"),
        ),
        // A trailing slash is ignored: `/inv/` is `/inv`, which no route matches.
        case(
            "an empty key segment",
            post(b"/inv/", b""),
            404,
            Some("no-route"),
        ),
        case(
            "an oversized key segment",
            post(long_segment.as_bytes(), b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "a key segment that is not UTF-8 decoded",
            post(b"/inv/%ff%fe", b""),
            400,
            Some("invalid-path"),
        ),
        case(
            "a non-UTF-8 fencing token",
            post(b"/inv/1", b"X-Fence: \xff\r\n"),
            400,
            Some("invalid-fence"),
        ),
    ]
}

#[tokio::test]
async fn malformed_requests_are_refused_and_never_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::builder(&routes(&upstream.url()))
        .server_options("max_header_bytes = \"8KiB\"")
        .start()
        .await;
    let cases = refused_cases();
    assert_eq!(cases.len(), 29);
    for (i, case) in cases.iter().enumerate() {
        let answer = exchange(gw.addr, &case.request).await;
        assert_eq!(
            answer.statuses(),
            [case.status],
            "{}: one answer, {}; got {:?}",
            case.name,
            case.status,
            answer.text()
        );
        if let Some(slug) = case.slug {
            assert!(
                answer.text().contains(&format!("/problems/{slug}\"")),
                "{}: a {slug} problem; got {:?}",
                case.name,
                answer.text()
            );
        }
        assert_eq!(
            upstream.seen().len(),
            i,
            "{}: nothing reached the upstream",
            case.name
        );
        // The gateway still serves: a normal request on a fresh connection is forwarded.
        let probe = send("POST", &gw.url("/inv/probe"), &[("x-fence", "1")], "").await;
        assert_eq!(probe.status, 200, "{}: the gateway still serves", case.name);
        assert_eq!(upstream.seen().len(), i + 1);
        assert_eq!(upstream.seen()[i].target, "/inv/probe");
    }
}

/// A chunked body of `payload`, then a whole second request the upstream must never see.
fn smuggled_after(head: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut request = head.to_vec();
    request.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
    request.extend_from_slice(payload);
    request.extend_from_slice(b"\r\n0\r\n\r\n");
    request.extend_from_slice(
        b"POST /inv/smuggled HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nContent-Length: 0\r\n\r\n",
    );
    request
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_refused_and_smuggles_nothing() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&routes(&upstream.url())).await;
    let heads: [&[u8]; 2] = [
        b"POST /inv/1 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /inv/2 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
    ];
    for head in heads {
        // No `Connection: close`: the gateway closes on its own after a CL+TE request; were it
        // to keep the connection open, `exchange` would fail waiting for the close.
        let answer = exchange(gw.addr, &smuggled_after(head, b"hello")).await;
        assert_eq!(answer.statuses(), [400], "{:?}", answer.text());
        assert!(answer.text().contains("/problems/ambiguous-framing\""));
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
}

/// Keep-alive requests framed each way, then one with both headers, on one connection.
#[tokio::test]
async fn only_the_ambiguous_request_on_a_kept_alive_connection_is_refused() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&routes(&upstream.url())).await;
    // The length-framed body holds text that would be an ambiguous head, were it read as one.
    let hidden: &[u8] =
        b"POST /inv/hidden HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut stream = format!(
        "POST /inv/1 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nContent-Length: {}\r\n\r\n",
        hidden.len()
    )
    .into_bytes();
    stream.extend_from_slice(hidden);
    stream.extend_from_slice(
        b"POST /inv/2 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nabcd\r\n0\r\nX-Trailer: t\r\n\r\n",
    );
    stream.extend_from_slice(b"GET /public/3 HTTP/1.1\r\nHost: gw\r\n\r\n");
    stream.extend_from_slice(&smuggled_after(
        b"POST /inv/4 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"hi",
    ));
    let answer = exchange(gw.addr, &stream).await;
    assert_eq!(
        answer.statuses(),
        [200, 200, 200, 400],
        "{:?}",
        answer.text()
    );
    let targets: Vec<String> = upstream.seen().into_iter().map(|r| r.target).collect();
    assert_eq!(targets, ["/inv/1", "/inv/2", "/public/3"]);
    assert_eq!(upstream.seen()[0].body_len, hidden.len() as u64);
    assert_eq!(upstream.seen()[1].body_len, 4);
}

#[tokio::test]
async fn a_request_hidden_in_a_body_stays_a_body() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&routes(&upstream.url())).await;
    let hidden =
        b"POST /inv/smuggled HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nContent-Length: 0\r\n\r\n";
    let mut request = format!(
        "POST /inv/1 HTTP/1.1\r\nHost: gw\r\nX-Fence: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        hidden.len()
    )
    .into_bytes();
    request.extend_from_slice(hidden);
    let answer = exchange(gw.addr, &request).await;
    assert_eq!(answer.statuses(), [200], "{:?}", answer.text());
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].target, "/inv/1");
    assert_eq!(seen[0].body_len, hidden.len() as u64);
    assert!(upstream.seen_under("/inv/smuggled").is_empty());
}

/// A raw request with the given request line and header lines, closing the connection after it.
fn raw(line: &str, headers: &str) -> Vec<u8> {
    format!("{line}\r\n{headers}X-Fence: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .into_bytes()
}

#[tokio::test]
async fn requests_upstreams_would_read_another_way_are_refused_with_their_problem_type() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    // With a catch-all, as the shipped configuration has one.
    let catch_all = format!(
        "[[routes]]\nname = \"rest\"\npath = \"/{{*rest}}\"\nupstream = \"{}\"\n[routes.fence]\nmode = \"off\"\n",
        upstream.url()
    );
    let gw = TestGateway::start(&format!("{}{catch_all}", routes(&upstream.url()))).await;
    let host = "Host: gw\r\n";
    let cases = [
        (
            "a lower-case method",
            raw("put /inv/1 HTTP/1.1", host),
            400,
            "invalid-method",
        ),
        (
            "a mixed-case method",
            raw("Post /inv/1 HTTP/1.1", host),
            400,
            "invalid-method",
        ),
        (
            "CONNECT",
            raw("CONNECT gw:443 HTTP/1.1", host),
            405,
            "method-not-allowed",
        ),
        (
            "a method override",
            raw(
                "POST /inv/1 HTTP/1.1",
                "Host: gw\r\nX-HTTP-Method-Override: PUT\r\n",
            ),
            400,
            "invalid-method",
        ),
        (
            "a _method parameter",
            raw("POST /inv/1?_method=PUT HTTP/1.1", host),
            400,
            "invalid-method",
        ),
        (
            "two Host headers",
            raw("PUT /inv/1 HTTP/1.1", "Host: gw\r\nHost: other\r\n"),
            400,
            "invalid-host",
        ),
        (
            "no Host header",
            raw("PUT /inv/1 HTTP/1.1", ""),
            400,
            "invalid-host",
        ),
        (
            "another authority",
            raw("PUT http://other/inv/1 HTTP/1.1", host),
            400,
            "invalid-host",
        ),
        (
            "parameters on a literal",
            raw("PUT /inv;x/1 HTTP/1.1", host),
            400,
            "invalid-path",
        ),
        (
            "parameters on a key",
            raw("PUT /inv/1;x=y HTTP/1.1", host),
            400,
            "invalid-path",
        ),
        (
            "a dot segment with parameters",
            raw("PUT /public/..;/inv/1 HTTP/1.1", host),
            400,
            "invalid-path",
        ),
        (
            "a double escape",
            raw("PUT /inv/%2531 HTTP/1.1", host),
            400,
            "invalid-path",
        ),
        (
            "a malformed escape",
            raw("PUT /inv/%zz HTTP/1.1", host),
            400,
            "invalid-path",
        ),
        (
            "a format suffix",
            raw("PUT /inv/1.json HTTP/1.1", host),
            400,
            "invalid-path",
        ),
        (
            "the reserved prefix, spelled otherwise",
            raw("POST //_fencegate/claim/inv:1 HTTP/1.1", host),
            400,
            "invalid-path",
        ),
        (
            "a collection of fenced keys",
            raw("DELETE /inv/ HTTP/1.1", host),
            403,
            "fenced-collection",
        ),
        (
            "a destination on a fenced route",
            raw(
                "MOVE /public/x HTTP/1.1",
                "Host: gw\r\nDestination: /INV//1\r\n",
            ),
            403,
            "fenced-destination",
        ),
        (
            "a destination on another host",
            raw(
                "MOVE /public/x HTTP/1.1",
                "Host: gw\r\nDestination: http://other/public/y\r\n",
            ),
            400,
            "invalid-destination",
        ),
    ];
    for (name, request, status, slug) in cases {
        let answer = exchange(gw.addr, &request).await;
        assert_eq!(answer.statuses(), [status], "{name}: {:?}", answer.text());
        assert!(
            answer.text().contains(&format!("/problems/{slug}\"")),
            "{name}: a {slug} problem; got {:?}",
            answer.text()
        );
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
}

#[tokio::test]
async fn the_canonical_path_that_matched_is_what_is_forwarded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&routes(&upstream.url())).await;
    let answer = exchange(
        gw.addr,
        &raw("PUT //INV//%31/?a=%2f HTTP/1.1", "Host: gw\r\n"),
    )
    .await;
    assert_eq!(answer.statuses(), [200], "{:?}", answer.text());
    let moved = raw(
        "MOVE /public/a HTTP/1.1",
        "Host: gw\r\nDestination: http://gw//public/%62\r\n",
    );
    assert_eq!(exchange(gw.addr, &moved).await.statuses(), [200]);
    let seen = upstream.seen();
    assert_eq!(seen[0].target, "/inv/1/?a=%2f");
    assert_eq!(gw.store().current("inv:1").await.unwrap(), Some(1));
    assert_eq!(seen[1].header("destination"), Some("http://gw/public/b"));
}
