//! A real HTTP/1.1 upstream that records every request it receives (headers, body size, arrival
//! and completion times) and answers according to a configured behaviour.

use std::convert::Infallible;
use std::net::SocketAddr;
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
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(answer(request, behavior, shared).await) }
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
        self.records
            .in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Requests whose handling was cut short by the client going away.
    pub fn abandoned(&self) -> Vec<Abandoned> {
        self.records.abandoned.lock().expect("record lock").clone()
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

impl Drop for RecordingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Counts the request in flight, and records it as abandoned if its handler is dropped before it
/// finishes.
struct InFlight {
    records: Arc<Records>,
    target: String,
    fence: Option<u64>,
    arrived: Instant,
    finished: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.records
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if !self.finished {
            if let Ok(mut abandoned) = self.records.abandoned.lock() {
                abandoned.push(Abandoned {
                    target: self.target.clone(),
                    fence: self.fence,
                    arrived: self.arrived,
                    torn_down: Instant::now(),
                });
            }
        }
    }
}

async fn answer(
    request: Request<Incoming>,
    behavior: Behavior,
    records: Arc<Records>,
) -> Response<Full<Bytes>> {
    let arrived = Instant::now();
    let (parts, mut body) = request.into_parts();
    records
        .in_flight
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut in_flight = InFlight {
        records: Arc::clone(&records),
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
