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

pub struct RecordingUpstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RecordingUpstream {
    pub async fn start(behavior: Behavior) -> RecordingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream address");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let record = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let record = Arc::clone(&record);
                        async move { Ok::<_, Infallible>(answer(request, behavior, record).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        RecordingUpstream { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("record lock").clone()
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

async fn answer(
    request: Request<Incoming>,
    behavior: Behavior,
    record: Arc<Mutex<Vec<Seen>>>,
) -> Response<Full<Bytes>> {
    let arrived = Instant::now();
    let (parts, mut body) = request.into_parts();
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
    record.lock().expect("record lock").push(seen);
    Response::builder()
        .header("x-upstream", "yes")
        .header("connection", "x-upstream-hop")
        .header("x-upstream-hop", "1")
        .header("keep-alive", "timeout=5")
        .body(Full::new(Bytes::from_static(b"ok")))
        .expect("static response")
}
