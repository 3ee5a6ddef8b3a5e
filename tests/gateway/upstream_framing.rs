//! How the gateway reads what an upstream sends back, byte by byte: chunked bodies with
//! extensions and trailers, close-delimited bodies, interim (1xx) responses, bodiless answers
//! (HEAD, 204, 304), conflicting or broken framing, oversized or malformed heads, bodies cut
//! short, idle connections the upstream closes, `Connection: close` and HTTP/1.0 answers, request
//! bodies on their way up, answers that come while the request body is still on its way, an
//! upstream that never answers, and a large body streamed slowly.
//!
//! Each test puts the gateway in front of a raw TCP upstream written here, which reads each
//! request (head and body, by its Content-Length or chunked) and writes exact bytes back, and
//! counts the connections it accepts: whether the gateway lends a connection again after an
//! answer is part of reading that answer right. (The early-answer tests use one that answers
//! after the head alone.) Each gateway has one serving thread, so one pool of upstream
//! connections whichever client connection a request comes on; only the test of slots shared
//! between threads has two.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::support::wire::{Head, Wire};
use crate::support::{send, TestGateway};

/// Longest any single exchange may take before the test fails.
const EXCHANGE_BOUND: Duration = Duration::from_secs(15);

/// How a request body was framed on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Framing {
    None,
    Length(usize),
    Chunked,
}

/// One request as the raw upstream read it.
#[derive(Debug, Clone)]
struct UpstreamSaw {
    /// Which accepted connection it came on (0 for the first).
    connection: usize,
    method: String,
    target: String,
    head: Head,
    framing: Framing,
    body: Vec<u8>,
}

/// What the raw upstream does after writing its answer.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// Reads the next request on the same connection.
    KeepAlive,
    /// Closes the connection.
    Close,
    /// Waits this long (reading nothing), then closes.
    CloseAfter(Duration),
}

/// The raw upstream's answer to one request: `pieces` written one after another, `pause`
/// between two; no pieces at all is an upstream that never answers.
struct Answer {
    pieces: Vec<Vec<u8>>,
    pause: Duration,
    then: Then,
}

impl Answer {
    /// `bytes` in one write, the connection kept.
    fn keep(bytes: &[u8]) -> Answer {
        Answer {
            pieces: vec![bytes.to_vec()],
            pause: Duration::ZERO,
            then: Then::KeepAlive,
        }
    }

    /// `bytes` in one write, then the connection closed.
    fn close(bytes: &[u8]) -> Answer {
        Answer {
            pieces: vec![bytes.to_vec()],
            pause: Duration::ZERO,
            then: Then::Close,
        }
    }
}

type Script = dyn Fn(&UpstreamSaw) -> Answer + Send + Sync;

/// A raw TCP upstream: reads each request whole, records it, and writes what `script` says.
struct RawUpstream {
    url: String,
    accepted: Arc<AtomicUsize>,
    saw: Arc<Mutex<Vec<UpstreamSaw>>>,
}

impl RawUpstream {
    async fn start(script: impl Fn(&UpstreamSaw) -> Answer + Send + Sync + 'static) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let saw = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let (counter, records) = (Arc::clone(&accepted), Arc::clone(&saw));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let connection = counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_raw(
                    Wire::new(stream),
                    connection,
                    Arc::clone(&records),
                    Arc::clone(&script),
                ));
            }
        });
        RawUpstream { url, accepted, saw }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn saw(&self) -> Vec<UpstreamSaw> {
        self.saw.lock().expect("records").clone()
    }
}

async fn serve_raw(
    mut conn: Wire,
    connection: usize,
    records: Arc<Mutex<Vec<UpstreamSaw>>>,
    script: Arc<Script>,
) {
    loop {
        let Some(head_bytes) = conn.read_until(b"\r\n\r\n").await else {
            return;
        };
        let head = Head::parse(&head_bytes);
        let mut start = head.start.split(' ');
        let method = start.next().unwrap_or_default().to_owned();
        let target = start.next().unwrap_or_default().to_owned();
        let (framing, body) = if head.is_chunked() {
            match conn.read_chunked().await {
                Ok((body, _)) => (Framing::Chunked, body),
                Err(_) => return,
            }
        } else if let Some(length) = head.get("content-length") {
            let length: usize = length.parse().expect("the gateway sends a numeric length");
            match conn.read_exact(length).await {
                Ok(body) => (Framing::Length(length), body),
                Err(_) => return,
            }
        } else {
            (Framing::None, Vec::new())
        };
        let saw = UpstreamSaw {
            connection,
            method,
            target,
            head,
            framing,
            body,
        };
        let answer = script(&saw);
        records.lock().expect("records").push(saw);
        if answer.pieces.is_empty() {
            // Never answers: holds the connection until the gateway gives up on it.
            conn.read_to_close().await;
            return;
        }
        for (i, piece) in answer.pieces.iter().enumerate() {
            if i > 0 && !answer.pause.is_zero() {
                tokio::time::sleep(answer.pause).await;
            }
            // The gateway may give up reading (a head it refuses): a failed write ends this.
            if conn.stream.write_all(piece).await.is_err() {
                return;
            }
        }
        match answer.then {
            Then::KeepAlive => {}
            Then::Close => return,
            Then::CloseAfter(wait) => {
                tokio::time::sleep(wait).await;
                return;
            }
        }
    }
}

/// One response as a raw client read it from the gateway.
#[derive(Debug)]
struct ClientGot {
    status: u16,
    head: Head,
    /// Statuses of interim (1xx) responses before it.
    interim: Vec<u16>,
    /// The body, chunked framing removed.
    body: Vec<u8>,
}

/// A raw HTTP/1.1 client on one keep-alive connection to the gateway (or on its read half, the
/// write half with a task of its own).
struct RawClient<S = TcpStream> {
    conn: Wire<S>,
}

impl RawClient {
    async fn connect(gw: &TestGateway) -> RawClient {
        let stream = TcpStream::connect(gw.addr)
            .await
            .expect("connect to gateway");
        RawClient {
            conn: Wire::new(stream),
        }
    }

    /// Sends `request` and reads one response (a HEAD request's has no body). `Err` describes a
    /// response that was cut short or never came.
    async fn exchange(&mut self, request: &[u8]) -> Result<ClientGot, String> {
        self.conn
            .stream
            .write_all(request)
            .await
            .map_err(|e| format!("writing the request failed: {e}"))?;
        let head_request = request.starts_with(b"HEAD ");
        tokio::time::timeout(EXCHANGE_BOUND, self.read_response(head_request))
            .await
            .map_err(|_| "no complete response in time".to_owned())?
    }

    /// `GET path` on this connection.
    async fn get(&mut self, path: &str) -> Result<ClientGot, String> {
        self.exchange(format!("GET {path} HTTP/1.1\r\nhost: gateway\r\n\r\n").as_bytes())
            .await
    }
}

impl<S: AsyncRead + Unpin> RawClient<S> {
    async fn read_response(&mut self, head_request: bool) -> Result<ClientGot, String> {
        let mut interim = Vec::new();
        loop {
            let head_bytes = self
                .conn
                .read_until(b"\r\n\r\n")
                .await
                .ok_or("the connection closed before a response head")?;
            let head = Head::parse(&head_bytes);
            let status: u16 = head
                .start
                .get(9..12)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("not a status line: {:?}", head.start))?;
            if (100..200).contains(&status) {
                interim.push(status);
                continue;
            }
            let body = if head_request || status == 204 || status == 304 {
                Vec::new()
            } else if head.is_chunked() {
                self.conn
                    .read_chunked()
                    .await
                    .map(|(body, _)| body)
                    .map_err(|got| {
                        format!(
                            "chunked body of {status} cut short after {} bytes",
                            got.len()
                        )
                    })?
            } else if let Some(length) = head.get("content-length") {
                let length: usize = length
                    .parse()
                    .map_err(|_| format!("gateway sent Content-Length {length:?}"))?;
                self.conn.read_exact(length).await.map_err(|got| {
                    format!(
                        "body of {status} cut short: {} of {length} bytes",
                        got.len()
                    )
                })?
            } else {
                self.conn.read_to_close().await
            };
            return Ok(ClientGot {
                status,
                head,
                interim,
                body,
            });
        }
    }
}

/// A passthrough route at `/plain/{id}` with no fencing, and `extra` route keys.
fn plain_route(upstream: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"plain\"\npath = \"/plain/{{id}}\"\nupstream = \"{upstream}\"\n{extra}\n[routes.fence]\nmode = \"off\"\n"
    )
}

/// A gateway with one serving thread, so that every client connection goes through one pool of
/// upstream connections and the upstream's count of connections says what was reused.
async fn gateway(upstream: &RawUpstream, extra: &str) -> TestGateway {
    TestGateway::builder(&plain_route(&upstream.url, extra))
        .server_options("workers = 1")
        .start()
        .await
}

/// `n` bytes that are not one byte repeated, so a lost or moved piece shows.
fn pattern(n: usize, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state >> 24) as u8
        })
        .collect()
}

/// `body` in chunked framing, `piece` bytes a chunk.
fn chunked(body: &[u8], piece: usize) -> Vec<Vec<u8>> {
    let mut chunks: Vec<Vec<u8>> = body
        .chunks(piece)
        .map(|c| {
            let mut chunk = format!("{:x}\r\n", c.len()).into_bytes();
            chunk.extend_from_slice(c);
            chunk.extend_from_slice(b"\r\n");
            chunk
        })
        .collect();
    chunks.push(b"0\r\n\r\n".to_vec());
    chunks
}

/// A chunked answer "hello world" in two chunks with extensions, and with `trailers` (lines
/// ending in CRLF) after the last chunk.
fn chunked_hello(trailers: &str) -> Answer {
    let declared = if trailers.is_empty() {
        ""
    } else {
        "trailer: x-checksum\r\n"
    };
    Answer::keep(
        format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n{declared}\r\n\
             5;ext=1\r\nhello\r\n6;name=\"quoted value\";flag\r\n world\r\n0\r\n{trailers}\r\n"
        )
        .as_bytes(),
    )
}

#[tokio::test]
async fn a_chunked_body_with_chunk_extensions_arrives_whole_and_its_connection_is_reused() {
    let upstream = RawUpstream::start(|_| chunked_hello("")).await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    for i in 0..3 {
        let got = client.get(&format!("/plain/{i}")).await.expect("answered");
        assert_eq!(got.status, 200, "{got:?}");
        assert_eq!(got.body, b"hello world", "{i}: {got:?}");
    }
    assert_eq!(upstream.saw().len(), 3);
    assert_eq!(
        upstream.accepted(),
        1,
        "the connection is lent again once the last chunk is read"
    );
}

#[tokio::test]
async fn a_chunked_body_with_trailers_arrives_whole_and_the_connection_stays_in_step() {
    let upstream = RawUpstream::start(|_| chunked_hello("x-checksum: abc\r\n")).await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    for i in 0..3 {
        let got = client.get(&format!("/plain/{i}")).await.expect("answered");
        assert_eq!(got.status, 200, "{got:?}");
        assert_eq!(got.body, b"hello world", "{i}: {got:?}");
    }
    let saw = upstream.saw();
    assert_eq!(saw.len(), 3, "each request went up once");
    // Today each answer with trailers costs its upstream connection (3 here): hyper's server
    // stops polling a response body after its trailers frame, so `PooledBody` is dropped before
    // it sees the end and never hands the connection back. A connection lent again with its
    // trailers unread would have answered the next request with them (the bodies are checked
    // above).
    println!(
        "3 answers with trailers opened {} upstream connections",
        upstream.accepted()
    );
    assert!((1..=3).contains(&upstream.accepted()));
}

/// The reuse the test above leaves open: an answer with trailers, read to its end, should leave
/// its connection to the next request. Today's code does not (see above).
#[tokio::test]
async fn a_chunked_body_with_trailers_leaves_its_connection_to_be_reused() {
    let upstream = RawUpstream::start(|_| chunked_hello("x-checksum: abc\r\n")).await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    for i in 0..3 {
        let got = client.get(&format!("/plain/{i}")).await.expect("answered");
        assert_eq!(got.body, b"hello world", "{i}: {got:?}");
    }
    assert_eq!(upstream.accepted(), 1);
}

#[tokio::test]
async fn a_close_delimited_body_arrives_whole_and_the_next_request_opens_a_new_connection() {
    let body = pattern(70_000, 2);
    let answer = body.clone();
    let upstream = RawUpstream::start(move |_| {
        let mut bytes =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\r\n".to_vec();
        bytes.extend_from_slice(&answer);
        Answer::close(&bytes)
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    for i in 0..2 {
        let got = client.get(&format!("/plain/{i}")).await.expect("answered");
        assert_eq!(got.status, 200, "{i}: {:?}", got.head);
        assert!(
            got.body == body,
            "{i}: {} bytes, not the body",
            got.body.len()
        );
    }
    let saw = upstream.saw();
    assert_eq!(saw.len(), 2);
    assert_eq!(
        upstream.accepted(),
        2,
        "a connection whose body ended at its close is never lent again"
    );
    assert_eq!((saw[0].connection, saw[1].connection), (0, 1));
}

#[tokio::test]
async fn interim_100_and_103_responses_before_the_final_one_are_passed_over() {
    let upstream = RawUpstream::start(|saw| {
        let interim: &[u8] = if saw.target.ends_with("/continue") {
            b"HTTP/1.1 100 Continue\r\n\r\n"
        } else {
            b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload; as=style\r\n\r\n"
        };
        let mut bytes = interim.to_vec();
        bytes.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal");
        Answer::keep(&bytes)
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    for path in ["/plain/continue", "/plain/early-hints", "/plain/continue"] {
        let got = client.get(path).await.expect("answered");
        assert_eq!(got.status, 200, "{path}: {got:?}");
        assert_eq!(got.body, b"final", "{path}: {got:?}");
        // Today neither interim response reaches the client (hyper's client drops them); a
        // client may be sent a 103, never a 100 it did not ask for.
        assert!(!got.interim.contains(&100), "{path}: {:?}", got.interim);
        println!(
            "{path}: interim responses the client saw: {:?}",
            got.interim
        );
    }
    assert_eq!(upstream.saw().len(), 3);
    // Nothing of an interim response is left behind to be read as the next answer.
    assert_eq!(upstream.accepted(), 1);
}

#[tokio::test]
async fn a_head_answer_with_a_content_length_has_no_body_and_its_connection_is_reused() {
    let upstream = RawUpstream::start(|saw| {
        if saw.method == "HEAD" {
            Answer::keep(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
        } else {
            Answer::keep(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nget")
        }
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    let head = client
        .exchange(b"HEAD /plain/1 HTTP/1.1\r\nhost: gateway\r\n\r\n")
        .await
        .expect("HEAD answered");
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.head.get("content-length"), Some("1000"), "{head:?}");
    // The next response on this connection must start right after the HEAD answer's head: a
    // byte of body sent after it would be read here as the start of the next response.
    let get = client.get("/plain/2").await.expect("GET answered");
    assert_eq!(get.status, 200, "{get:?}");
    assert_eq!(get.body, b"get");
    let saw = upstream.saw();
    assert_eq!(
        saw.iter().map(|s| s.method.as_str()).collect::<Vec<_>>(),
        ["HEAD", "GET"]
    );
    assert_eq!(
        upstream.accepted(),
        1,
        "the gateway did not wait for (or count) a body after a HEAD answer"
    );
}

#[tokio::test]
async fn answers_204_and_304_have_no_body_and_their_connection_is_reused() {
    let upstream = RawUpstream::start(|saw| match saw.target.as_str() {
        "/plain/no-content" => Answer::keep(b"HTTP/1.1 204 No Content\r\nx-kind: 204\r\n\r\n"),
        // A 304 may carry the length of the representation it stands for; no body follows.
        "/plain/not-modified" => Answer::keep(
            b"HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\ncontent-length: 1000\r\n\r\n",
        ),
        _ => Answer::keep(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext"),
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    let no_content = client.get("/plain/no-content").await.expect("answered");
    assert_eq!(no_content.status, 204, "{no_content:?}");
    assert_eq!(no_content.head.get("x-kind"), Some("204"));
    let not_modified = client
        .exchange(
            b"GET /plain/not-modified HTTP/1.1\r\nhost: gateway\r\nif-none-match: \"v1\"\r\n\r\n",
        )
        .await
        .expect("answered");
    assert_eq!(not_modified.status, 304, "{not_modified:?}");
    assert_eq!(not_modified.head.get("etag"), Some("\"v1\""));
    let next = client.get("/plain/next").await.expect("answered");
    assert_eq!(next.status, 200, "{next:?}");
    assert_eq!(next.body, b"next");
    assert_eq!(upstream.saw().len(), 3);
    assert_eq!(upstream.accepted(), 1);
}

/// The raw client's error when the gateway closed the connection before a response head.
const CLOSED: &str = "the connection closed before a response head";

/// An upstream that answers `/plain/cl-N` with `Content-Length: N` and `Transfer-Encoding:
/// chunked` (in that order; `/plain/te-first-N` the other way round) over the chunked body
/// "hello world", and anything else `next`.
async fn both_framings_upstream() -> RawUpstream {
    RawUpstream::start(|saw| {
        let target = saw.target.trim_start_matches("/plain/");
        let both = if let Some(n) = target.strip_prefix("cl-") {
            format!("content-length: {n}\r\ntransfer-encoding: chunked\r\n")
        } else if let Some(n) = target.strip_prefix("te-first-") {
            format!("transfer-encoding: chunked\r\ncontent-length: {n}\r\n")
        } else {
            return Answer::keep(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext");
        };
        Answer::keep(
            format!("HTTP/1.1 200 OK\r\n{both}\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
                .as_bytes(),
        )
    })
    .await
}

// What hyper's client did with such an answer (before the gateway had its own): it read the body
// as chunked (RFC 9112 §6.3: Transfer-Encoding overrides Content-Length), checked the
// Content-Length field no further, and left it in the head. The gateway strips Transfer-Encoding
// (hop-by-hop) and keeps Content-Length, and hyper's server framed the client's response by that
// field: with `3` it sent `content-length: 3` and "hel", with `20` the 11 decoded bytes and a
// close. An intermediary must drop the received Content-Length (RFC 9112 §6.3) or refuse the
// answer; the strict test below asks that (it failed on hyper's client; the gateway's own client
// refuses such an answer with a 502).

#[tokio::test]
async fn a_response_with_both_content_length_and_chunked_never_reaches_the_client_with_both() {
    let upstream = both_framings_upstream().await;
    let gw = gateway(&upstream, "").await;
    for path in [
        "/plain/cl-3",
        "/plain/te-first-3",
        "/plain/cl-11",
        "/plain/cl-20",
    ] {
        let mut client = RawClient::connect(&gw).await;
        let got = client.get(path).await;
        println!("{path}: {got:?}");
        if let Ok(got) = &got {
            assert!(got.status == 200 || got.status == 502, "{path}: {got:?}");
            assert!(
                got.head.get("content-length").is_none() || !got.head.is_chunked(),
                "{path}: both framings reached the client: {:?}",
                got.head
            );
            if got.status == 200 {
                // Never the chunk framing as data, never bytes that were not in the body.
                assert!(
                    b"hello world".starts_with(&got.body),
                    "{path}: {:?}",
                    String::from_utf8_lossy(&got.body)
                );
            }
            if path == "/plain/cl-11" && got.status == 200 {
                assert_eq!(got.body, b"hello world", "{path}");
            }
        }
        // The client's connection is in step: the next answer on it is the next one whole, or
        // the connection was closed; never the rest of the last body read as a response.
        match client.get("/plain/next").await {
            Ok(next) => assert_eq!((next.status, &next.body[..]), (200, &b"next"[..]), "{path}"),
            Err(e) => assert_eq!(e, CLOSED, "{path}"),
        }
    }
}

#[tokio::test]
async fn a_response_with_both_content_length_and_chunked_is_forwarded_chunked_decoded_or_refused() {
    let upstream = both_framings_upstream().await;
    let gw = gateway(&upstream, "").await;
    for path in ["/plain/cl-3", "/plain/te-first-3", "/plain/cl-20"] {
        let got = RawClient::connect(&gw)
            .await
            .get(path)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        if got.status == 502 {
            continue;
        }
        assert_eq!(got.status, 200, "{path}: {got:?}");
        assert_eq!(got.body, b"hello world", "{path}: {got:?}");
        assert!(
            got.head.get("content-length").is_none_or(|n| n == "11"),
            "{path}: {:?}",
            got.head
        );
    }
}

#[tokio::test]
async fn conflicting_or_non_numeric_content_lengths_are_a_502() {
    let upstream = RawUpstream::start(|saw| match saw.target.as_str() {
        "/plain/two-lengths" => {
            Answer::keep(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!")
        }
        "/plain/two-lengths-one-field" => {
            Answer::keep(b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\nhello!")
        }
        _ => Answer::keep(b"HTTP/1.1 200 OK\r\ncontent-length: five\r\n\r\nhello"),
    })
    .await;
    let gw = gateway(&upstream, "").await;
    for path in [
        "/plain/two-lengths",
        "/plain/two-lengths-one-field",
        "/plain/not-a-number",
    ] {
        let reply = send("GET", &gw.url(path), &[], "").await;
        println!("{path}: {reply:?}");
        assert_eq!(reply.status, 502, "{path}: {reply:?}");
        assert_eq!(reply.problem_slug(), "upstream-unavailable", "{path}");
    }
    assert_eq!(upstream.saw().len(), 3);
}

#[tokio::test]
async fn a_response_head_over_1_mib_or_with_a_field_line_without_a_colon_is_a_502() {
    let upstream = RawUpstream::start(|saw| {
        if saw.target == "/plain/huge-head" {
            let mut bytes = b"HTTP/1.1 200 OK\r\n".to_vec();
            // 64-byte field lines: 17,000 of them is over 1 MiB.
            for i in 0..17_000 {
                bytes.extend_from_slice(
                    format!("x-filler-{i:05}: {}\r\n", "v".repeat(47)).as_bytes(),
                );
            }
            bytes.extend_from_slice(b"content-length: 2\r\n\r\nok");
            assert!(bytes.len() > 1024 * 1024);
            Answer::keep(&bytes)
        } else {
            Answer::keep(b"HTTP/1.1 200 OK\r\nx-good: 1\r\nBogus\r\ncontent-length: 2\r\n\r\nok")
        }
    })
    .await;
    let gw = gateway(&upstream, "").await;
    for path in ["/plain/huge-head", "/plain/no-colon"] {
        let reply = send("GET", &gw.url(path), &[], "").await;
        assert_eq!(reply.status, 502, "{path}: {reply:?}");
        assert_eq!(reply.problem_slug(), "upstream-unavailable", "{path}");
    }
    assert_eq!(upstream.saw().len(), 2);
}

#[tokio::test]
async fn a_body_cut_short_never_reaches_the_client_complete_and_the_next_request_works() {
    let upstream = RawUpstream::start(|saw| {
        if saw.target == "/plain/cut" {
            Answer::close(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
        } else {
            Answer::keep(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext")
        }
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    let cut = client.get("/plain/cut").await;
    println!("cut short: {cut:?}");
    match &cut {
        Err(_) => {}
        Ok(got) => assert!(
            got.status != 200 || got.body.len() != 100,
            "a complete 100-byte body out of 10 bytes: {got:?}"
        ),
    }
    // The client's connection was closed (or is unusable): the next request comes on another.
    let mut client = RawClient::connect(&gw).await;
    let next = client.get("/plain/next").await.expect("answered");
    assert_eq!(next.status, 200, "{next:?}");
    assert_eq!(next.body, b"next");
    assert_eq!(upstream.saw().len(), 2);
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn an_idle_connection_the_upstream_closed_costs_a_new_connection_not_a_502() {
    let upstream = RawUpstream::start(|_| Answer {
        pieces: vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()],
        pause: Duration::ZERO,
        // Keep-alive as far as the answer says; closed 100 ms later.
        then: Then::CloseAfter(Duration::from_millis(100)),
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    let first = client.get("/plain/first").await.expect("answered");
    assert_eq!((first.status, &first.body[..]), (200, &b"ok"[..]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = client.get("/plain/second").await.expect("answered");
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.body, b"ok");
    let saw = upstream.saw();
    let targets: Vec<&str> = saw.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(
        targets,
        ["/plain/first", "/plain/second"],
        "each exactly once"
    );
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn an_answer_with_connection_close_ends_that_connection_even_if_the_upstream_keeps_it() {
    // The upstream says `Connection: close` but keeps reading: a gateway that lent the
    // connection again would be answered on it, and the upstream would count one connection.
    let upstream = RawUpstream::start(|_| {
        Answer::keep(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 5\r\n\r\nhello")
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    for i in 0..2 {
        let got = client.get(&format!("/plain/{i}")).await.expect("answered");
        assert_eq!(got.status, 200, "{got:?}");
        assert_eq!(got.body, b"hello");
        // The upstream's `Connection: close` is its own hop's: the client's connection stays.
        assert_ne!(got.head.get("connection"), Some("close"), "{got:?}");
    }
    let saw = upstream.saw();
    assert_eq!((saw[0].connection, saw[1].connection), (0, 1));
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn an_http_1_0_answer_without_keep_alive_ends_that_connection() {
    // As above, the upstream keeps reading: only the gateway's reading of HTTP/1.0 closes it.
    let upstream =
        RawUpstream::start(|_| Answer::keep(b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\nhello"))
            .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    for i in 0..2 {
        let got = client.get(&format!("/plain/{i}")).await.expect("answered");
        assert_eq!(got.status, 200, "{got:?}");
        assert_eq!(got.body, b"hello");
    }
    let saw = upstream.saw();
    assert_eq!((saw[0].connection, saw[1].connection), (0, 1));
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn request_bodies_of_256_kib_reach_the_upstream_byte_for_byte_with_valid_framing() {
    const SIZE: usize = 256 * 1024;
    let upstream = RawUpstream::start(|saw| {
        let answer = format!("{}", saw.body.len());
        Answer::keep(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}",
                answer.len()
            )
            .as_bytes(),
        )
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;

    let sized = pattern(SIZE, 13);
    let mut request =
        format!("POST /plain/sized HTTP/1.1\r\nhost: gateway\r\ncontent-length: {SIZE}\r\n\r\n")
            .into_bytes();
    request.extend_from_slice(&sized);
    let got = client.exchange(&request).await.expect("answered");
    assert_eq!((got.status, got.body), (200, SIZE.to_string().into_bytes()));

    let streamed = pattern(SIZE, 14);
    let mut request =
        b"POST /plain/chunked HTTP/1.1\r\nhost: gateway\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    // Uneven chunks, one with an extension.
    for (i, piece) in streamed.chunks(10_007).enumerate() {
        request.extend_from_slice(format!("{:x}", piece.len()).as_bytes());
        if i == 3 {
            request.extend_from_slice(b";note=x");
        }
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(piece);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let got = client.exchange(&request).await.expect("answered");
    assert_eq!((got.status, got.body), (200, SIZE.to_string().into_bytes()));

    let saw = upstream.saw();
    assert_eq!(saw.len(), 2);
    assert_eq!(saw[0].target, "/plain/sized");
    assert_eq!(saw[0].framing, Framing::Length(SIZE), "{:?}", saw[0].head);
    assert!(saw[0].body == sized, "the sized body arrived changed");
    assert!(
        saw[0].head.get("transfer-encoding").is_none(),
        "{:?}",
        saw[0].head
    );
    assert_eq!(saw[1].target, "/plain/chunked");
    // Either framing is valid for a body whose length the gateway did not know up front.
    println!("a chunked upload went up framed as {:?}", saw[1].framing);
    match saw[1].framing {
        Framing::Chunked => assert!(saw[1].head.get("content-length").is_none()),
        Framing::Length(n) => assert_eq!(n, SIZE),
        Framing::None => panic!("a 256 KiB body went up without framing: {:?}", saw[1].head),
    }
    assert!(saw[1].body == streamed, "the chunked body arrived changed");
}

#[tokio::test]
async fn an_upstream_that_never_answers_is_a_504_after_the_route_timeout() {
    let upstream = RawUpstream::start(|_| Answer {
        pieces: Vec::new(),
        pause: Duration::ZERO,
        then: Then::KeepAlive,
    })
    .await;
    let gw = gateway(&upstream, "timeout = \"1s\"\n").await;
    let started = Instant::now();
    let reply = send("GET", &gw.url("/plain/silent"), &[], "").await;
    let took = started.elapsed();
    assert_eq!(reply.status, 504, "{reply:?}");
    assert_eq!(reply.problem_slug(), "upstream-timeout");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "answered after {took:?}"
    );
    assert_eq!(upstream.saw().len(), 1);
}

#[tokio::test]
async fn a_body_over_1_mib_streamed_in_pieces_with_pauses_arrives_intact() {
    let body = pattern(1536 * 1024, 15);
    let answer = body.clone();
    let upstream = RawUpstream::start(move |_| {
        let mut pieces = vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec()];
        pieces.extend(chunked(&answer, 64 * 1024));
        Answer {
            pieces,
            pause: Duration::from_millis(15),
            then: Then::KeepAlive,
        }
    })
    .await;
    let gw = gateway(&upstream, "").await;
    let mut client = RawClient::connect(&gw).await;
    for i in 0..2 {
        let got = client.get(&format!("/plain/{i}")).await.expect("answered");
        assert_eq!(got.status, 200, "{:?}", got.head);
        assert_eq!(got.body.len(), body.len());
        assert!(got.body == body, "{i}: the body arrived changed");
    }
    assert_eq!(upstream.accepted(), 1);
}

/// A raw TCP upstream that hands each connection it accepts, with its number (0 for the first),
/// to `serve`, which reads and writes as it likes: unlike [`RawUpstream`] it can answer while a
/// request body is still arriving.
struct LiveUpstream {
    url: String,
    accepted: Arc<AtomicUsize>,
}

impl LiveUpstream {
    async fn start<F, Fut>(serve: F) -> LiveUpstream
    where
        F: Fn(Wire, usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let connection = counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(Wire::new(stream), connection));
            }
        });
        LiveUpstream { url, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A client connection to `gw` whose request (`head`, then `body` in pieces of `piece` bytes,
/// `pause` after each) is written by a task of its own while the response is read. The task
/// counts the body bytes written, stops at the first failed write, and returns the write half,
/// so the connection is not half-closed when the body is all sent.
async fn upload_slowly(
    gw: &TestGateway,
    head: String,
    body: Vec<u8>,
    piece: usize,
    pause: Duration,
) -> (
    RawClient<OwnedReadHalf>,
    Arc<AtomicUsize>,
    JoinHandle<OwnedWriteHalf>,
) {
    let stream = TcpStream::connect(gw.addr)
        .await
        .expect("connect to gateway");
    let (read, mut write) = stream.into_split();
    let written = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&written);
    let writer = tokio::spawn(async move {
        if write.write_all(head.as_bytes()).await.is_err() {
            return write;
        }
        for data in body.chunks(piece) {
            if write.write_all(data).await.is_err() {
                break;
            }
            counter.fetch_add(data.len(), Ordering::SeqCst);
            tokio::time::sleep(pause).await;
        }
        write
    });
    let client = RawClient {
        conn: Wire::new(read),
    };
    (client, written, writer)
}

/// What the upstream of the early-error test saw on one connection.
#[derive(Debug, Default)]
struct EarlySeen {
    /// Request lines, in order.
    requests: Vec<String>,
    /// Bytes read after answering the upload early (the body's beginning, and anything after).
    after_answer: Vec<u8>,
    /// Whether the gateway closed the connection.
    closed: bool,
}

#[tokio::test]
async fn an_early_error_answer_stops_the_upload_and_its_connection_is_not_reused() {
    const SIZE: usize = 1024 * 1024;
    let seen: Arc<Mutex<Vec<EarlySeen>>> = Arc::default();
    let log = Arc::clone(&seen);
    let upstream = LiveUpstream::start(move |mut conn, connection| {
        let log = Arc::clone(&log);
        async move {
            let record = |f: &dyn Fn(&mut EarlySeen)| {
                let mut seen = log.lock().expect("log");
                if seen.len() <= connection {
                    seen.resize_with(connection + 1, EarlySeen::default);
                }
                f(&mut seen[connection]);
            };
            while let Some(head) = conn.read_until(b"\r\n\r\n").await {
                let head = Head::parse(&head);
                record(&|seen| seen.requests.push(head.start.clone()));
                if head.start.starts_with("POST ") {
                    // Only the head read: the answer goes out at once, then whatever comes is
                    // read and kept aside, never answered, until the gateway closes.
                    let answer =
                        b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\n\r\ntoo big!";
                    if conn.stream.write_all(answer).await.is_err() {
                        break;
                    }
                    loop {
                        let rest = std::mem::take(&mut conn.buffer);
                        record(&|seen| seen.after_answer.extend_from_slice(&rest));
                        if !conn.fill().await {
                            break;
                        }
                    }
                    break;
                }
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext";
                if conn.stream.write_all(answer).await.is_err() {
                    break;
                }
            }
            record(&|seen| seen.closed = true);
        }
    })
    .await;
    let gw = TestGateway::builder(&plain_route(&upstream.url, ""))
        .server_options("workers = 1")
        .start()
        .await;

    // 64 KiB every 200 ms: the whole megabyte would take over 3 s.
    let head =
        format!("POST /plain/up HTTP/1.1\r\nhost: gateway\r\ncontent-length: {SIZE}\r\n\r\n");
    let (mut client, written, writer) = upload_slowly(
        &gw,
        head,
        pattern(SIZE, 21),
        64 * 1024,
        Duration::from_millis(200),
    )
    .await;
    let got = tokio::time::timeout(EXCHANGE_BOUND, client.read_response(false))
        .await
        .expect("an answer in time")
        .expect("a whole answer");
    let written_then = written.load(Ordering::SeqCst);
    println!("413 after {written_then} of {SIZE} body bytes written");
    assert_eq!(got.status, 413, "{got:?}");
    assert_eq!(got.body, b"too big!");
    assert!(
        written_then <= SIZE / 2,
        "the early answer came only after {written_then} of {SIZE} bytes were sent"
    );

    // The gateway stops sending and closes that connection: it is never lent again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !seen.lock().expect("log").first().is_some_and(|s| s.closed) {
        assert!(
            Instant::now() < deadline,
            "the gateway kept the answered upload's connection open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut next = RawClient::connect(&gw).await;
    let got = next.get("/plain/next").await.expect("answered");
    assert_eq!((got.status, &got.body[..]), (200, &b"next"[..]), "{got:?}");
    assert_eq!(
        upstream.accepted(),
        2,
        "the next request came on a new connection"
    );

    let seen = seen.lock().expect("log");
    println!(
        "the upload's connection carried {} body bytes after the answer",
        seen[0].after_answer.len()
    );
    assert_eq!(seen[0].requests, ["POST /plain/up HTTP/1.1"]);
    assert!(
        seen[0].after_answer.len() < SIZE,
        "the whole body went up after the 413"
    );
    assert!(
        !seen[0]
            .after_answer
            .windows(b"/plain/next".len())
            .any(|w| w == b"/plain/next"),
        "the next request was written on the upload's connection"
    );
    assert_eq!(seen[1].requests, ["GET /plain/next HTTP/1.1"]);
    writer.abort();
}

#[tokio::test]
async fn an_early_success_answer_lets_the_upload_go_on_beside_it() {
    const SIZE: usize = 256 * 1024;
    let requests: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let log = Arc::clone(&requests);
    let upstream = LiveUpstream::start(move |mut conn, connection| {
        let log = Arc::clone(&log);
        async move {
            while let Some(head) = conn.read_until(b"\r\n\r\n").await {
                let head = Head::parse(&head);
                log.lock()
                    .expect("log")
                    .push((connection, head.start.clone()));
                let Some(length) = head.get("content-length") else {
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext";
                    if conn.stream.write_all(answer).await.is_err() {
                        return;
                    }
                    continue;
                };
                // The head of a streamed answer before any of the body is read; its one chunk
                // says how much of the body came, once all of it has.
                let length: usize = length.parse().expect("a numeric length");
                let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                if conn.stream.write_all(answer).await.is_err() {
                    return;
                }
                let Ok(body) = conn.read_exact(length).await else {
                    return;
                };
                let text = format!("{} {}", body.len(), byte_sum(&body));
                let chunk = format!("{:x}\r\n{text}\r\n0\r\n\r\n", text.len());
                if conn.stream.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let gw = TestGateway::builder(&plain_route(&upstream.url, ""))
        .server_options("workers = 1")
        .start()
        .await;

    let body = pattern(SIZE, 22);
    let expected = format!("{SIZE} {}", byte_sum(&body));
    let head =
        format!("POST /plain/stream HTTP/1.1\r\nhost: gateway\r\ncontent-length: {SIZE}\r\n\r\n");
    let (mut client, written, writer) =
        upload_slowly(&gw, head, body, 16 * 1024, Duration::from_millis(20)).await;
    let got = tokio::time::timeout(EXCHANGE_BOUND, client.read_response(false))
        .await
        .expect("an answer in time")
        .expect("a whole answer");
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        String::from_utf8_lossy(&got.body),
        expected,
        "the upstream got the whole body after it answered"
    );
    assert_eq!(written.load(Ordering::SeqCst), SIZE);
    drop(writer.await.expect("the writer"));

    // A connection whose answer came before the body was all sent is not lent again.
    let got = RawClient::connect(&gw)
        .await
        .get("/plain/next")
        .await
        .expect("answered");
    assert_eq!((got.status, &got.body[..]), (200, &b"next"[..]), "{got:?}");
    assert_eq!(
        *requests.lock().expect("log"),
        [
            (0, "POST /plain/stream HTTP/1.1".to_owned()),
            (1, "GET /plain/next HTTP/1.1".to_owned()),
        ]
    );
    assert_eq!(upstream.accepted(), 2);
}

/// The sum of `bytes`, mod 2^32: a check that the body arrived as sent.
fn byte_sum(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(0u32, |sum, byte| sum.wrapping_add(u32::from(*byte)))
}

// Each serving thread has its own pool of idle upstream connections, but the slots of an
// upstream's `max_upstream_connections` are shared by all of them. An idle connection the
// upstream closed still holds its slot until the thread that pooled it drops it: when that thread
// sweeps its pool (once a second) or next takes a connection from it. With one slot and two
// threads taking turns, a thread that only dropped such connections when it next used its pool
// would leave the other thread waiting out `upstream_connection_wait` (then a 503
// `upstream-busy`) for a slot held by a dead connection.

#[tokio::test]
async fn idle_connections_the_upstream_closed_give_their_slot_back_to_other_threads() {
    let upstream = RawUpstream::start(|_| Answer {
        pieces: vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()],
        pause: Duration::ZERO,
        // Keep-alive as far as the answer says; closed 100 ms later.
        then: Then::CloseAfter(Duration::from_millis(100)),
    })
    .await;
    let gw = TestGateway::builder(&plain_route(
        &upstream.url,
        "max_upstream_connections = 1\n",
    ))
    .server_options("workers = 2\nupstream_connection_wait = \"3s\"")
    .start()
    .await;
    for i in 0..8 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // A new client connection each time: the two serving threads take them in turn.
        let started = Instant::now();
        let got = RawClient::connect(&gw)
            .await
            .get(&format!("/plain/{i}"))
            .await
            .unwrap_or_else(|e| panic!("{i}: {e}"));
        println!("{i}: {} after {:?}", got.status, started.elapsed());
        assert_eq!(got.status, 200, "{i}: {got:?}");
        assert_eq!(got.body, b"ok", "{i}");
    }
    assert_eq!(upstream.saw().len(), 8);
    assert_eq!(
        upstream.accepted(),
        8,
        "each connection was closed after one answer"
    );
}
