//! `fencegate::server::response_body` against hyper's own HTTP/1 server: for each request and
//! response body (data frames and trailers, with the framing fields the response names), hyper's
//! service answers with the body, and the gateway's reader, writer and encoder together must give
//! the same bytes, from the status line to the body's end (the `date` value taken from hyper's),
//! and close the connection exactly when hyper does (a body shorter than its length closes it,
//! after as much as the server had flushed). The HTTP/1 server that is to replace hyper's
//! (issue 37) writes bodies this way.

use std::convert::Infallible;

use bytes::{Bytes, BytesMut};
use fencegate::server::request_head::parse_request_head;
use fencegate::server::response_body::BodyEncoder;
use fencegate::server::response_head::{write_response_head, Answering, BodySize};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper::Response;

use crate::support::hyper_peer::{date_field, send_until_quiet, serve_one, MAX_HEAD_BYTES};

/// One exchange: the raw request, the response's fields, its data frames and its trailers.
#[derive(Clone, Copy, Debug)]
struct Case {
    request: &'static str,
    headers: &'static [(&'static str, &'static str)],
    data: &'static [&'static str],
    trailers: &'static [(&'static str, &'static str)],
}

const GET: &str = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
const GET_TRAILERS: &str = "GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n";
const GET_10: &str = "GET / HTTP/1.0\r\n\r\n";

fn corpus() -> Vec<Case> {
    let case = |request, headers, data, trailers| Case {
        request,
        headers,
        data,
        trailers,
    };
    vec![
        case(GET, &[], &["a", "bc", "", "def"], &[]),
        case(GET, &[], &["x"], &[]),
        case(GET, &[], &["0123456789abcdef0123"], &[]),
        case(GET, &[("content-length", "4")], &["ab", "cd"], &[]),
        case(GET, &[("content-length", "3")], &["ab", "cd"], &[]),
        case(GET, &[("content-length", "6")], &["ab", "cd"], &[]),
        case(GET, &[("trailer", "x-sum")], &["ab"], &[("x-sum", "1")]),
        case(
            GET_TRAILERS,
            &[("trailer", "x-sum")],
            &["ab"],
            &[("x-sum", "1")],
        ),
        case(
            GET_TRAILERS,
            &[("trailer", "x-sum, x-b")],
            &["ab"],
            &[("x-sum", "1"), ("x-b", "2"), ("x-c", "3")],
        ),
        case(
            GET_TRAILERS,
            &[("trailer", "x-sum")],
            &["ab"],
            &[("x-other", "1")],
        ),
        case(
            GET_TRAILERS,
            &[("trailer", "content-type")],
            &["ab"],
            &[("content-type", "a/b")],
        ),
        case(GET_TRAILERS, &[], &["ab"], &[("x-sum", "1")]),
        case(
            GET_TRAILERS,
            &[("trailer", "x-sum"), ("content-length", "2")],
            &["ab"],
            &[("x-sum", "1")],
        ),
        case(
            GET_TRAILERS,
            &[("trailer", "x-sum")],
            &[],
            &[("x-sum", "1")],
        ),
        case(GET_10, &[], &["old", "er"], &[]),
        case(GET_10, &[("trailer", "x-sum")], &["ab"], &[("x-sum", "1")]),
    ]
}

/// The service's body: the case's frames, from a stream (no size known).
fn body(case: Case) -> BoxBody<Bytes, Infallible> {
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = case
        .data
        .iter()
        .map(|piece| Ok(Frame::data(Bytes::from_static(piece.as_bytes()))))
        .collect();
    if !case.trailers.is_empty() {
        frames.push(Ok(Frame::trailers(fields(case.trailers))));
    }
    StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

fn fields(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    map
}

/// Everything hyper wrote for `case`, and whether it closed the connection after it.
async fn hyper_answer(case: Case) -> (Vec<u8>, bool) {
    let addr = serve_one(move |_request| async move {
        let mut response = Response::new(body(case));
        *response.headers_mut() = fields(case.headers);
        response
    })
    .await;
    send_until_quiet(addr, case.request.as_bytes()).await
}

/// The gateway's pieces on `case`: the bytes written, whether the connection closes, and whether
/// the body was cut (shorter than its length).
fn ours(case: Case, date: &[u8]) -> (Vec<u8>, bool, bool) {
    let mut request = BytesMut::from(case.request.as_bytes());
    let request = parse_request_head(&mut request, MAX_HEAD_BYTES)
        .expect("a request hyper serves")
        .expect("a whole request");
    let mut out = Vec::new();
    let written = write_response_head(
        &mut out,
        Answering {
            method: &request.method,
            version: request.version,
            keep_alive: request.keep_alive,
        },
        StatusCode::OK,
        Version::HTTP_11,
        fields(case.headers),
        BodySize::Unknown,
        date,
    )
    .expect("a head hyper writes");
    let mut encoder = BodyEncoder::new(written.framing, written.trailers, request.accepts_trailers);
    for piece in case.data {
        encoder.data(piece.as_bytes(), &mut out);
    }
    if !case.trailers.is_empty() {
        encoder.trailers(fields(case.trailers), &mut out);
    }
    let cut = encoder.end(&mut out).is_err();
    (out, written.last || cut, cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_bodies_are_written_as_hypers_server_writes_them() {
    let cases = corpus();
    let answers = futures_util::future::join_all(cases.iter().map(|case| hyper_answer(*case)));
    let mut disagreements = Vec::new();
    for (case, (answer, closed)) in cases.iter().zip(answers.await) {
        let (written, last, cut) = ours(*case, &date_field(&answer));
        // A body cut short closes the connection; how much of it went out first depends on when
        // the server flushed (hyper, whose body here ends at once, had sent nothing).
        let agrees = if cut {
            closed && written.starts_with(&answer)
        } else {
            written == answer && last == closed
        };
        if !agrees {
            disagreements.push(format!(
                "{case:?}:\n  hyper (closed: {closed}): {:?}\n  ours (closed: {last}): {:?}",
                String::from_utf8_lossy(&answer),
                String::from_utf8_lossy(&written),
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "the encoder and hyper's server disagree on {} of {} bodies:\n{}",
        disagreements.len(),
        cases.len(),
        disagreements.join("\n")
    );
}
