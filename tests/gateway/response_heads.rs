//! `fencegate::server::response_head` against hyper's own HTTP/1 server (the auto builder the
//! gateway serves with): for each request and response in the corpus, hyper's service answers the
//! request with the response, and the writer must give the same head, byte for byte (the `date`
//! value taken from hyper's), frame the body as hyper framed it, and close the connection after
//! it exactly when hyper does; where hyper writes nothing and closes, the writer must refuse. The
//! HTTP/1 server that is to replace hyper's (issue 37) writes heads this way.

use std::convert::Infallible;

use bytes::{Bytes, BytesMut};
use fencegate::server::request_head::parse_request_head;
use fencegate::server::response_head::{
    write_response_head, Answering, BodyFraming, BodySize, Written,
};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::Response;

use crate::support::hyper_peer::{date_field, send_until_quiet, serve_one, MAX_HEAD_BYTES};

/// How the service's response body is made.
#[derive(Clone, Copy, Debug)]
enum Body {
    /// Empty: ended before it is polled.
    Ended,
    /// Whole, its length known.
    Full(&'static str),
    /// Two pieces from a stream, its length unknown.
    Stream(&'static str, &'static str),
}

impl Body {
    fn size(self) -> BodySize {
        match self {
            Body::Ended => BodySize::Ended,
            Body::Full(text) => BodySize::Known(text.len() as u64),
            Body::Stream(..) => BodySize::Unknown,
        }
    }

    fn text(self) -> String {
        match self {
            Body::Ended => String::new(),
            Body::Full(text) => text.to_owned(),
            Body::Stream(a, b) => format!("{a}{b}"),
        }
    }

    fn into_body(self) -> BoxBody<Bytes, Infallible> {
        match self {
            Body::Ended => Full::new(Bytes::new()).boxed(),
            Body::Full(text) => Full::new(Bytes::from_static(text.as_bytes())).boxed(),
            Body::Stream(a, b) => StreamBody::new(futures_util::stream::iter([
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(a.as_bytes()))),
                Ok(Frame::data(Bytes::from_static(b.as_bytes()))),
            ]))
            .boxed(),
        }
    }
}

/// One exchange: the raw request, and the response hyper's service gives.
#[derive(Clone, Copy, Debug)]
struct Case {
    request: &'static str,
    status: u16,
    version: Version,
    headers: &'static [(&'static str, &'static str)],
    body: Body,
}

const fn case(
    request: &'static str,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: Body,
) -> Case {
    Case {
        request,
        status,
        version: Version::HTTP_11,
        headers,
        body,
    }
}

const GET: &str = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
const GET_10: &str = "GET / HTTP/1.0\r\n\r\n";
const GET_10_KEEP: &str = "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
const GET_CLOSE: &str = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
const HEAD: &str = "HEAD / HTTP/1.1\r\nHost: a\r\n\r\n";

fn corpus() -> Vec<Case> {
    use Body::*;
    let mut cases = vec![
        case(GET, 200, &[], Ended),
        case(GET, 200, &[], Full("hello")),
        case(GET, 200, &[], Stream("hel", "lo")),
        case(
            GET,
            200,
            &[("content-type", "text/plain"), ("x-a", "1")],
            Full("hi"),
        ),
        case(
            GET,
            200,
            &[("set-cookie", "a=1"), ("set-cookie", "b=2")],
            Ended,
        ),
        case(GET, 200, &[("content-length", "5")], Full("hello")),
        case(GET, 200, &[("content-length", "5")], Stream("hel", "lo")),
        case(
            GET,
            200,
            &[("content-length", "5"), ("content-length", "5")],
            Stream("he", "llo"),
        ),
        case(
            GET,
            200,
            &[("transfer-encoding", "chunked")],
            Stream("a", "b"),
        ),
        case(GET, 200, &[("transfer-encoding", "gzip")], Stream("a", "b")),
        case(
            GET,
            200,
            &[("transfer-encoding", "gzip, chunked")],
            Stream("a", "b"),
        ),
        case(GET, 200, &[("trailer", "x-t")], Stream("a", "b")),
        case(GET, 200, &[("connection", "keep-alive")], Full("k")),
        case(GET, 200, &[("connection", "close")], Full("c")),
        case(
            GET,
            200,
            &[("connection", "x-a"), ("connection", "x-b")],
            Ended,
        ),
        case(
            GET,
            200,
            &[("date", "Thu, 01 Jan 2026 00:00:00 GMT")],
            Ended,
        ),
        case(GET, 200, &[("content-length", "7")], Ended),
        case(GET, 404, &[], Full("not")),
        case(GET, 500, &[], Stream("x", "y")),
        case(GET, 204, &[], Ended),
        case(GET, 204, &[("content-length", "0")], Ended),
        case(
            GET,
            304,
            &[("content-length", "10"), ("etag", "\"e\"")],
            Ended,
        ),
        case(GET, 299, &[], Full("odd")),
        case(GET_CLOSE, 200, &[], Full("bye")),
        case(GET_CLOSE, 200, &[("connection", "x-a")], Stream("b", "ye")),
        case(GET_10, 200, &[], Full("old")),
        case(GET_10, 200, &[], Stream("o", "ld")),
        case(
            GET_10,
            200,
            &[("transfer-encoding", "chunked")],
            Stream("o", "ld"),
        ),
        case(GET_10_KEEP, 200, &[], Full("ka")),
        case(GET_10_KEEP, 200, &[], Stream("k", "a")),
        case(GET_10_KEEP, 200, &[("connection", "x-a")], Ended),
        case(GET_10_KEEP, 200, &[("trailer", "x-t")], Full("t")),
        case(HEAD, 200, &[], Ended),
        case(HEAD, 200, &[("content-length", "42")], Ended),
        case(HEAD, 200, &[], Full("hello")),
        case(HEAD, 200, &[], Stream("a", "b")),
        case(
            "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            200,
            &[("allow", "GET")],
            Ended,
        ),
        // hyper writes nothing for these and closes the connection.
        case(
            GET,
            200,
            &[("transfer-encoding", "chunked"), ("content-length", "2")],
            Stream("a", "b"),
        ),
        case(
            GET,
            200,
            &[("content-length", "2"), ("transfer-encoding", "chunked")],
            Stream("a", "b"),
        ),
        case(GET, 200, &[("content-length", "x")], Stream("a", "b")),
    ];
    // Upstream answers in HTTP/1.0, handed on as they came.
    for (request, body) in [
        (GET, Body::Full("u")),
        (GET, Body::Stream("u", "p")),
        (GET_10_KEEP, Body::Full("u")),
        (GET_10_KEEP, Body::Stream("u", "p")),
    ] {
        let mut old = case(request, 200, &[], body);
        old.version = Version::HTTP_10;
        cases.push(old);
    }
    cases
}

/// Everything hyper wrote for one request, answered with `case`'s response, and whether it
/// closed the connection after it.
async fn hyper_answer(case: Case) -> (Vec<u8>, bool) {
    let addr = serve_one(move |_request| async move {
        let mut response = Response::new(case.body.into_body());
        *response.status_mut() = StatusCode::from_u16(case.status).expect("status");
        *response.version_mut() = case.version;
        for (name, value) in case.headers {
            response.headers_mut().append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        response
    })
    .await;
    send_until_quiet(addr, case.request.as_bytes()).await
}

/// The writer's head and written state for `case`, with `date`.
fn written(case: Case, date: &[u8]) -> (Vec<u8>, Result<Written, String>) {
    let mut request = BytesMut::from(case.request.as_bytes());
    let request = parse_request_head(&mut request, MAX_HEAD_BYTES)
        .expect("a request hyper serves")
        .expect("a whole request");
    let mut headers = HeaderMap::new();
    for (name, value) in case.headers {
        headers.append(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    let mut head = Vec::new();
    let outcome = write_response_head(
        &mut head,
        Answering {
            method: &request.method,
            version: request.version,
            keep_alive: request.keep_alive,
        },
        StatusCode::from_u16(case.status).expect("status"),
        case.version,
        headers,
        case.body.size(),
        date,
    )
    .map_err(|e| e.to_string());
    (head, outcome)
}

/// Whether `rest` (what followed the head) is `body` framed as `framing` says.
fn framed_as(rest: &[u8], framing: BodyFraming, body: &str, has_body: bool) -> bool {
    let body = if has_body { body.as_bytes() } else { b"" };
    match framing {
        BodyFraming::Length(length) => rest.len() as u64 == length && rest == body,
        BodyFraming::UntilClose => rest == body,
        BodyFraming::Chunked => {
            let mut data = Vec::new();
            let mut at = rest;
            loop {
                let Some(line) = at.windows(2).position(|w| w == b"\r\n") else {
                    return false;
                };
                let Some(size) = std::str::from_utf8(&at[..line])
                    .ok()
                    .and_then(|s| usize::from_str_radix(s, 16).ok())
                else {
                    return false;
                };
                at = &at[line + 2..];
                if size == 0 {
                    return at == b"\r\n" && data == body;
                }
                if at.len() < size + 2 {
                    return false;
                }
                data.extend_from_slice(&at[..size]);
                at = &at[size + 2..];
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_heads_are_written_as_hypers_server_writes_them() {
    let cases = corpus();
    let answers = futures_util::future::join_all(cases.iter().map(|case| hyper_answer(*case)));
    let mut disagreements = Vec::new();
    for (case, (answer, closed)) in cases.iter().zip(answers.await) {
        let head_end = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|at| at + 4);
        let (head, outcome) = written(*case, &date_field(&answer));
        let has_body = !case.request.starts_with("HEAD") && ![204, 304].contains(&case.status);
        let agrees = match (head_end, &outcome) {
            (None, Err(_)) => answer.is_empty() && closed,
            (Some(end), Ok(done)) => {
                answer[..end] == head[..]
                    && framed_as(&answer[end..], done.framing, &case.body.text(), has_body)
                    && done.last == closed
            }
            _ => false,
        };
        if !agrees {
            disagreements.push(format!(
                "{case:?}:\n  hyper (closed: {closed}): {:?}\n  writer: {:?} {outcome:?}",
                String::from_utf8_lossy(&answer),
                String::from_utf8_lossy(&head),
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "the writer and hyper's server disagree on {} of {} exchanges:\n{}",
        disagreements.len(),
        cases.len(),
        disagreements.join("\n")
    );
}
