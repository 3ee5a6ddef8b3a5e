//! `fencegate::server::request_head` against hyper's own HTTP/1 server, configured as the
//! gateway configures it (the auto builder, its head-size limit): for every raw request in the
//! corpus, hyper either refuses it before its service runs, with the status the parser gives, or
//! hands its service the request the parser reads (method, target, version, the fields in order),
//! reads the body the parser's framing says, and keeps the connection open exactly when the parser
//! says it may. The HTTP/1 server that is to replace hyper's (issue 37) reads heads this way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use fencegate::server::request_head::{parse_request_head, RequestFraming};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::hyper_peer::{serve_one, MAX_HEAD_BYTES};

/// What hyper's service was handed: method, target, version, fields in order, the body read.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    method: String,
    target: String,
    version: http::Version,
    fields: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// A hyper server answering every request with an empty 200, after recording it and reading its
/// body; the requests seen, in arrival order.
async fn hyper_server() -> (std::net::SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let addr = serve_one(move |request: Request<Incoming>| {
        let record = Arc::clone(&record);
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.map(|b| b.to_bytes().to_vec());
            record.lock().expect("record").push(Seen {
                method: parts.method.to_string(),
                target: parts.uri.to_string(),
                version: parts.version,
                fields: parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                    .collect(),
                body: body.unwrap_or_else(|_| b"<body failed>".to_vec()),
            });
            Response::new(String::new())
        }
    })
    .await;
    (addr, seen)
}

/// What a client saw: the first response's status, and whether the connection was closed after it.
async fn exchange(addr: std::net::SocketAddr, raw: &[u8]) -> (u16, bool) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(raw).await.expect("write");
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    // The whole answer: hyper's bodies here are empty, so the head ends it.
    let head_end = loop {
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(read > 0, "closed before an answer to {raw:?}");
        received.extend_from_slice(&buffer[..read]);
    };
    let status = std::str::from_utf8(&received[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    let closed = if received.len() > head_end {
        false
    } else {
        matches!(
            tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buffer)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    };
    (status, closed)
}

/// Requests (head and whatever body follows it), each alone on a connection.
fn corpus() -> Vec<&'static [u8]> {
    vec![
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /p?q=1 HTTP/1.1\r\nHost: a\r\nX-One: 1\r\nx-one: 2\r\nAccept: */*\r\n\r\n",
        b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET / HTTP/1.1\nHost: a\n\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: caf\xe9\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET http://a/abs HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nConnection: keep-alive, CLOSE\r\n\r\n",
        b"GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: CHUNKED\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\na\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551614\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.2\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
        b"GET /a b HTTP/1.1\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
        b"GET / HTTP/1.1\r\n Folded: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nX:\r\n\r\n",
        b"GET / HTTP/1.1\r\nX : y\r\n\r\n",
        b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
        b"get / HTTP/1.1\r\n\r\n",
        b"GET /\x7f HTTP/1.1\r\n\r\n",
        b"GET /%zz HTTP/1.1\r\n\r\n",
    ]
}

/// The parser's reading of each request: refused with a status, or the request hyper's service
/// should see and whether the connection stays open.
enum Reading {
    Refused(u16),
    Served { seen: Seen, keep_alive: bool },
}

fn read(raw: &[u8]) -> Reading {
    let mut buffer = BytesMut::from(raw);
    let head = match parse_request_head(&mut buffer, MAX_HEAD_BYTES) {
        Ok(Some(head)) => head,
        Ok(None) => panic!("{raw:?}: the parser wants more bytes"),
        Err(refused) => return Reading::Refused(refused.status().as_u16()),
    };
    let body = match head.framing {
        RequestFraming::Length(length) => buffer[..length as usize].to_vec(),
        RequestFraming::Chunked => dechunk(&buffer),
    };
    Reading::Served {
        keep_alive: head.keep_alive,
        seen: Seen {
            method: head.method.to_string(),
            target: head.uri.to_string(),
            version: head.version,
            fields: head
                .headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            body,
        },
    }
}

/// The data of a chunked body without extensions or trailers (what the corpus holds).
fn dechunk(mut bytes: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    loop {
        let line = bytes
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a size line");
        let size = usize::from_str_radix(std::str::from_utf8(&bytes[..line]).expect("hex"), 16)
            .expect("a chunk size");
        bytes = &bytes[line + 2..];
        if size == 0 {
            return data;
        }
        data.extend_from_slice(&bytes[..size]);
        bytes = &bytes[size + 2..];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_read_as_hypers_server_reads_them() {
    let mut disagreements = Vec::new();
    for raw in corpus() {
        // A server of its own for each request, so that what its service saw is this request's.
        let (addr, seen) = hyper_server().await;
        let (status, closed) = exchange(addr, raw).await;
        let served = seen.lock().expect("record").pop();
        let raw_text = String::from_utf8_lossy(raw);
        match (read(raw), served) {
            (Reading::Refused(expected), None) if expected == status && closed => {}
            (Reading::Served { seen, keep_alive }, Some(served))
                if status == 200 && seen == served && keep_alive != closed => {}
            (Reading::Refused(expected), served) => disagreements.push(format!(
                "{raw_text:?}: parser refuses with {expected}; hyper answered {status} \
                 (closed: {closed}) after its service saw {served:?}"
            )),
            (Reading::Served { seen, keep_alive }, served) => disagreements.push(format!(
                "{raw_text:?}: parser reads {seen:?}, keep-alive {keep_alive}; hyper answered \
                 {status} (closed: {closed}) after its service saw {served:?}"
            )),
        }
    }
    assert!(
        disagreements.is_empty(),
        "the parser and hyper's server disagree:\n{}",
        disagreements.join("\n")
    );
}
