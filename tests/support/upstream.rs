//! A real HTTP/1.1 upstream that records every request it receives (headers, body size, arrival
//! and completion times) and answers according to a configured behaviour.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rand::Rng as _;
use tokio::net::TcpListener;

/// How the upstream answers.
#[derive(Debug, Clone, Copy)]
pub enum Behavior {
    /// 200 at once.
    Ok,
    /// 200 after a fixed delay.
    Delay(Duration),
    /// 200 after a random delay up to the bound.
    RandomDelay(Duration),
}

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query, exactly as received.
    pub target: String,
    pub headers: HeaderMap,
    pub body_len: u64,
    pub arrived: Instant,
    pub finished: Instant,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn fence(&self) -> Option<u64> {
        self.header("x-fence").and_then(|v| v.parse().ok())
    }
}

/// A request whose handling ended before the upstream answered: the client (the gateway) went
/// away and its connection was torn down.
#[derive(Debug, Clone)]
pub struct Abandoned {
    pub target: String,
    pub fence: Option<u64>,
    pub arrived: Instant,
    /// The first time the upstream saw the connection closed: when another request arrived and
    /// found it closed in the kernel, or else when its handler was dropped. Later arrivals
    /// therefore never carry an earlier instant than this, whichever task ran first.
    pub torn_down: Instant,
}

/// Header that makes the upstream wait this many milliseconds before answering one request.
pub const DELAY_HEADER: &str = "x-test-delay-ms";

/// Everything the upstream records, shared by its connection tasks.
#[derive(Default)]
struct Records {
    seen: Mutex<Vec<Seen>>,
    abandoned: Mutex<Vec<Abandoned>>,
    in_flight: std::sync::atomic::AtomicUsize,
    /// The connections of requests being handled, by request, to look at when another arrives.
    open: Mutex<HashMap<u64, OpenRequest>>,
    next_request: AtomicU64,
}

/// A request being handled: a second handle on its connection's socket, and when the upstream
/// first found that connection closed.
struct OpenRequest {
    socket: Arc<std::net::TcpStream>,
    closed_seen: Option<Instant>,
    target: String,
    fence: Option<u64>,
    arrived: Instant,
}

impl OpenRequest {
    fn abandoned(&self, torn_down: Instant) -> Abandoned {
        Abandoned {
            target: self.target.clone(),
            fence: self.fence,
            arrived: self.arrived,
            torn_down,
        }
    }
}

impl Records {
    /// Marks every handled request whose connection the kernel already holds closed (end of
    /// stream or reset). Called before a new arrival is timed, so that the order of two
    /// connections' events is the order the kernel got them in, not the order in which the
    /// upstream's tasks happened to run.
    fn see_closed_connections(&self) {
        let Ok(mut open) = self.open.lock() else {
            return;
        };
        let now = Instant::now();
        for request in open.values_mut().filter(|r| r.closed_seen.is_none()) {
            let closed = match request.socket.peek(&mut [0u8; 1]) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            };
            if closed {
                request.closed_seen = Some(now);
            }
        }
    }
}

pub struct RecordingUpstream {
    pub addr: SocketAddr,
    records: Arc<Records>,
    task: tokio::task::JoinHandle<()>,
}

impl RecordingUpstream {
    pub async fn start(behavior: Behavior) -> RecordingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream address");
        let records: Arc<Records> = Arc::default();
        let shared = Arc::clone(&records);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let Ok((stream, socket)) = with_second_handle(stream) else {
                    continue;
                };
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        let socket = Arc::clone(&socket);
                        async move {
                            Ok::<_, Infallible>(answer(request, behavior, shared, socket).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        RecordingUpstream {
            addr,
            records,
            task,
        }
    }

    /// Requests being handled right now.
    pub fn in_flight(&self) -> usize {
        self.records.in_flight.load(Ordering::SeqCst)
    }

    /// Requests whose handling was cut short by the client going away: their handler was
    /// dropped, or a later arrival found their connection closed while the handler still ran.
    pub fn abandoned(&self) -> Vec<Abandoned> {
        let mut abandoned = self.records.abandoned.lock().expect("record lock").clone();
        let open = self.records.open.lock().expect("record lock");
        abandoned.extend(
            open.values()
                .filter_map(|r| r.closed_seen.map(|closed| r.abandoned(closed))),
        );
        abandoned
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.records.seen.lock().expect("record lock").clone()
    }

    /// Requests whose target starts with `prefix`.
    pub fn seen_under(&self, prefix: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.target.starts_with(prefix))
            .collect()
    }
}

/// The accepted stream and a second handle on its socket (same kernel socket, non-blocking),
/// dropped with the connection's task.
fn with_second_handle(
    stream: tokio::net::TcpStream,
) -> std::io::Result<(tokio::net::TcpStream, Arc<std::net::TcpStream>)> {
    let stream = stream.into_std()?;
    let socket = Arc::new(stream.try_clone()?);
    Ok((tokio::net::TcpStream::from_std(stream)?, socket))
}

impl Drop for RecordingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Counts the request in flight, and records it as abandoned if its handler is dropped before it
/// finishes.
struct InFlight {
    records: Arc<Records>,
    id: u64,
    finished: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = Instant::now();
        let request = self
            .records
            .open
            .lock()
            .ok()
            .and_then(|mut open| open.remove(&self.id));
        self.records.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let (false, Some(request)) = (self.finished, request) {
            if let Ok(mut abandoned) = self.records.abandoned.lock() {
                abandoned.push(request.abandoned(request.closed_seen.unwrap_or(now)));
            }
        }
    }
}

async fn answer(
    request: Request<Incoming>,
    behavior: Behavior,
    records: Arc<Records>,
    socket: Arc<std::net::TcpStream>,
) -> Response<Full<Bytes>> {
    records.see_closed_connections();
    let arrived = Instant::now();
    let (parts, mut body) = request.into_parts();
    let id = records.next_request.fetch_add(1, Ordering::SeqCst);
    if let Ok(mut open) = records.open.lock() {
        open.insert(
            id,
            OpenRequest {
                socket,
                closed_seen: None,
                target: parts
                    .uri
                    .path_and_query()
                    .map_or("/", |pq| pq.as_str())
                    .to_owned(),
                fence: parts
                    .headers
                    .get("x-fence")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse().ok()),
                arrived,
            },
        );
    }
    records.in_flight.fetch_add(1, Ordering::SeqCst);
    let mut in_flight = InFlight {
        records: Arc::clone(&records),
        id,
        finished: false,
    };
    let extra_delay = parts
        .headers
        .get(DELAY_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let mut body_len = 0u64;
    // Count the body frame by frame: a large upload is never held in memory.
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    body_len += data.len() as u64;
                }
            }
            Err(_) => break,
        }
    }
    match behavior {
        Behavior::Ok => {}
        Behavior::Delay(delay) => tokio::time::sleep(delay).await,
        Behavior::RandomDelay(bound) => {
            let micros = rand::thread_rng().gen_range(0..=bound.as_micros() as u64);
            tokio::time::sleep(Duration::from_micros(micros)).await;
        }
    }
    if let Some(delay) = extra_delay {
        tokio::time::sleep(delay).await;
    }
    in_flight.finished = true;
    let seen = Seen {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned(),
        headers: parts.headers,
        body_len,
        arrived,
        finished: Instant::now(),
    };
    records.seen.lock().expect("record lock").push(seen);
    Response::builder()
        .header("x-upstream", "yes")
        .header("connection", "x-upstream-hop")
        .header("x-upstream-hop", "1")
        .header("keep-alive", "timeout=5")
        .body(Full::new(Bytes::from_static(b"ok")))
        .expect("static response")
}
