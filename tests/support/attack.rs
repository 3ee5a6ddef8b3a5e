//! Clients that misbehave the way an attacker's would: sockets that never send a byte, heads and
//! prefaces cut short, HTTP/2 connections with hundreds of streams or a zero stream window, and an
//! HTTP/1.1 client that stops reading its response. Each reports what the gateway did to it.

use std::io::{ErrorKind, Read as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use h2::RecvStream;
use http::{Request, Response};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

/// Longest a connect to the gateway may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often [`SilentSockets::wait_all_closed`] looks at its sockets.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Longest the gateway's HTTP/2 SETTINGS may take to arrive.
const SETTINGS_TIMEOUT: Duration = Duration::from_secs(5);
/// Most of an answer's body kept to read its problem type.
const KEPT_BODY: usize = 64 * 1024;

/// Connections that were opened and then never sent a byte, watched without blocking.
pub struct SilentSockets {
    sockets: Vec<Silent>,
    pub opened: Instant,
}

struct Silent {
    /// `None` once the gateway has closed (or reset) the connection.
    stream: Option<std::net::TcpStream>,
    /// What the gateway wrote on it, if anything (a 503 refusal, say).
    received: Vec<u8>,
}

/// Where a set of silent sockets stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    /// Still open, nothing received.
    pub open: usize,
    /// Closed by the gateway, or answered 503 (the refusal of a connection over a cap).
    pub refused: usize,
}

impl SilentSockets {
    /// Opens `count` connections to `addr` and sends nothing on any of them.
    pub fn open(addr: SocketAddr, count: usize) -> SilentSockets {
        let sockets = (0..count)
            .map(|i| {
                let stream = std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                    .unwrap_or_else(|e| panic!("silent connection {i} to {addr}: {e}"));
                stream
                    .set_nonblocking(true)
                    .expect("non-blocking silent socket");
                Silent {
                    stream: Some(stream),
                    received: Vec::new(),
                }
            })
            .collect();
        SilentSockets {
            sockets,
            opened: Instant::now(),
        }
    }

    /// Reads whatever has arrived on every socket, without waiting, and counts them.
    pub fn census(&mut self) -> Census {
        let mut census = Census {
            open: 0,
            refused: 0,
        };
        for socket in &mut self.sockets {
            socket.poll();
            if socket.stream.is_none() || socket.received.starts_with(b"HTTP/1.1 503") {
                census.refused += 1;
            } else {
                census.open += 1;
            }
        }
        census
    }

    /// Sockets the gateway has not closed yet (whatever it wrote on them).
    pub fn still_open(&mut self) -> usize {
        let mut open = 0;
        for socket in &mut self.sockets {
            socket.poll();
            open += usize::from(socket.stream.is_some());
        }
        open
    }

    /// Waits until the gateway has closed every socket, at most until `bound` after they were
    /// opened: the time that took, or how many were still open at the bound.
    pub async fn wait_all_closed(&mut self, bound: Duration) -> Result<Duration, usize> {
        loop {
            let open = self.still_open();
            if open == 0 {
                return Ok(self.opened.elapsed());
            }
            if self.opened.elapsed() >= bound {
                return Err(open);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

impl Silent {
    /// Drains what the gateway sent; notes the end of the connection.
    fn poll(&mut self) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    if self.received.len() < KEPT_BODY {
                        self.received.extend_from_slice(&buffer[..n]);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.stream = None;
    }
}

/// Reads (and drops) from `stream` until the gateway closes it: how long after `since` that
/// happened, or `None` if it was still open `bound` after `since`.
pub async fn closed_within(
    stream: &mut TcpStream,
    since: Instant,
    bound: Duration,
) -> Option<Duration> {
    let deadline = tokio::time::Instant::from_std(since + bound);
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(since.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Reads one HTTP/1.1 response (head, and a body framed by `Content-Length` or chunks) from a
/// kept-alive connection; panics if it does not arrive within `bound`.
pub async fn read_one_response(stream: &mut TcpStream, bound: Duration) -> String {
    let read = async {
        let mut bytes = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            if let Some(end) = response_end(&bytes) {
                bytes.truncate(end);
                return String::from_utf8_lossy(&bytes).into_owned();
            }
            let n = stream.read(&mut buffer).await.expect("read response");
            assert!(
                n > 0,
                "the gateway closed the connection mid-response: {:?}",
                String::from_utf8_lossy(&bytes)
            );
            bytes.extend_from_slice(&buffer[..n]);
        }
    };
    tokio::time::timeout(bound, read)
        .await
        .expect("the gateway answered the request")
}

/// Where the first complete response in `bytes` ends, if it has arrived.
fn response_end(bytes: &[u8]) -> Option<usize> {
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
    if let Some(length) = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse::<usize>().ok())
    {
        return (bytes.len() >= head_end + length).then_some(head_end + length);
    }
    if head.contains("transfer-encoding: chunked") {
        let body = &bytes[head_end..];
        return body
            .windows(5)
            .position(|w| w == b"0\r\n\r\n")
            .filter(|&at| at == 0 || body[..at].ends_with(b"\r\n"))
            .map(|at| head_end + at + 5);
    }
    Some(head_end)
}

/// Sends `request` on a connection whose receive buffer is small, reads the response's head and
/// then stops reading: the gateway's writes fill the socket and stall. Returns the connection
/// (to keep it open) and the head.
pub async fn request_and_stop_reading(addr: SocketAddr, request: &[u8]) -> (TcpStream, String) {
    let socket = TcpSocket::new_v4().expect("client socket");
    // A fixed small buffer: the kernel does not grow it (autotuning is off once it is set).
    socket
        .set_recv_buffer_size(16 * 1024)
        .expect("small receive buffer");
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr))
        .await
        .expect("connect in time")
        .expect("connect to gateway");
    stream.write_all(request).await.expect("write request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let read_head = async {
        while !head.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut byte).await.expect("read response head");
            assert!(n > 0, "closed before a response head");
            head.push(byte[0]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read_head)
        .await
        .expect("the response head arrived");
    (stream, String::from_utf8_lossy(&head).into_owned())
}

/// An HTTP/2 (h2c, prior knowledge) connection driven in the background.
pub struct H2Connection {
    pub send: SendRequest<Bytes>,
    authority: String,
    driver: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

impl H2Connection {
    /// Connects and completes the handshake with the client's default settings.
    pub async fn open(addr: SocketAddr) -> H2Connection {
        H2Connection::open_with(addr, &h2::client::Builder::new()).await
    }

    /// Connects with a stream receive window of `window` bytes: the gateway may send no more
    /// than that of any response body until the client releases capacity, which it never does.
    pub async fn open_with_stream_window(addr: SocketAddr, window: u32) -> H2Connection {
        H2Connection::open_with(addr, h2::client::Builder::new().initial_window_size(window)).await
    }

    async fn open_with(addr: SocketAddr, builder: &h2::client::Builder) -> H2Connection {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("connect in time")
            .expect("connect to gateway");
        let (send, connection) = builder
            .handshake::<_, Bytes>(tcp)
            .await
            .expect("HTTP/2 handshake");
        let driver = tokio::spawn(connection);
        // The handshake is complete once the gateway's SETTINGS have come; they name its stream
        // limit, which the client does not know before (and which it then keeps to).
        let deadline = Instant::now() + SETTINGS_TIMEOUT;
        while send.current_max_send_streams() == usize::MAX {
            assert!(
                Instant::now() < deadline,
                "the gateway's HTTP/2 SETTINGS (with its stream limit) did not arrive"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        H2Connection {
            send,
            authority: addr.to_string(),
            driver,
        }
    }

    /// A request for `path` on this connection, with `headers`.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.authority));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).expect("request")
    }

    /// Waits for the gateway to close the connection: how long after `since`, or `None` if it
    /// was still open `bound` after `since`.
    pub async fn closed_within(self, since: Instant, bound: Duration) -> Option<Duration> {
        let deadline = tokio::time::Instant::from_std(since + bound);
        let mut driver = self.driver;
        // Keep the sender: dropping the last one would make the client end the connection itself.
        let _send = self.send;
        match tokio::time::timeout_at(deadline, &mut driver).await {
            Ok(_) => Some(since.elapsed()),
            Err(_) => {
                driver.abort();
                None
            }
        }
    }
}

/// What one HTTP/2 stream got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum H2Outcome {
    /// A response: its status and, for a problem document, its type's slug.
    Answered { status: u16, slug: Option<String> },
    /// The stream or the connection failed before a response head came.
    Failed(String),
}

/// Sends `request` (with `body`, if any) as one stream and reads the answer.
pub async fn h2_exchange(
    send: SendRequest<Bytes>,
    request: Request<()>,
    body: Option<Bytes>,
) -> H2Outcome {
    let mut send = match send.ready().await {
        Ok(send) => send,
        Err(e) => return H2Outcome::Failed(format!("no stream: {e}")),
    };
    let (response, mut stream) = match send.send_request(request, body.is_none()) {
        Ok(pair) => pair,
        Err(e) => return H2Outcome::Failed(format!("send request: {e}")),
    };
    if let Some(body) = body {
        // A gateway that answers before reading the whole body resets the rest of it: the
        // answer still counts, so a failed send is not an outcome of its own.
        let _ = stream.send_data(body, true);
    }
    let response = match response.await {
        Ok(response) => response,
        Err(e) => return H2Outcome::Failed(format!("response: {e}")),
    };
    let status = response.status().as_u16();
    let body = read_h2_body(response.into_body()).await;
    H2Outcome::Answered {
        status,
        slug: problem_slug(&body),
    }
}

/// Sends `request` as one stream and returns the response head without reading any of its body.
pub async fn h2_response_head(
    send: SendRequest<Bytes>,
    request: Request<()>,
) -> Response<RecvStream> {
    let mut send = send.ready().await.expect("an HTTP/2 stream");
    let (response, _stream) = send.send_request(request, true).expect("send request");
    tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the response head arrived in time")
        .expect("a response head")
}

/// Reads a response body (up to [`KEPT_BODY`] of it kept), giving its capacity back as it goes.
async fn read_h2_body(mut body: RecvStream) -> Vec<u8> {
    let mut kept = Vec::new();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { break };
        let _ = body.flow_control().release_capacity(chunk.len());
        if kept.len() < KEPT_BODY {
            kept.extend_from_slice(&chunk);
        }
    }
    kept
}

/// The slug of a problem document's `type` (`.../memory-busy` → `memory-busy`).
pub fn problem_slug(body: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let kind = json.get("type")?.as_str()?;
    Some(kind.rsplit('/').next().unwrap_or_default().to_owned())
}
