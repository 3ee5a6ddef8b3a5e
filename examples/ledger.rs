//! A demo upstream for the README walk-through: an in-memory ledger that knows nothing about
//! fencing. It keeps the last body written to each path and echoes the `X-Fence` header it was sent,
//! so you can watch what fencegate forwards — and see that stale writes never arrive.
//!
//! `cargo run --release --example ledger [ADDR]` (default `127.0.0.1:9000`). POST/PUT/PATCH store the body,
//! GET returns it, DELETE removes it. Every write and delete is printed as one line.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const DEFAULT_ADDR: &str = "127.0.0.1:9000";
/// Largest body the ledger keeps: everything lives in memory.
const MAX_BODY: usize = 64 * 1024;
/// Most paths the ledger remembers, so that a runaway client cannot exhaust memory.
const MAX_ENTRIES: usize = 10_000;

type Ledger = Arc<Mutex<HashMap<String, Bytes>>>;
type Reply = Response<Full<Bytes>>;

/// The answer to a write, fields in the order a reader expects them.
#[derive(serde::Serialize)]
struct Written<'a> {
    path: &'a str,
    stored: &'a str,
    fence: Option<&'a str>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| DEFAULT_ADDR.to_owned());
    let listener = match TcpListener::bind(&addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("ledger: cannot listen on {addr}: {e}");
            std::process::exit(1);
        }
    };
    println!("ledger listening on http://{}", listener.local_addr()?);
    let ledger = Ledger::default();
    loop {
        let (stream, _) = listener.accept().await?;
        let ledger = Arc::clone(&ledger);
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(Arc::clone(&ledger), request));
            let io = TokioIo::new(stream);
            if let Err(e) = http1::Builder::new().serve_connection(io, service).await {
                eprintln!("ledger: connection error: {e}");
            }
        });
    }
}

async fn handle(ledger: Ledger, request: Request<Incoming>) -> Result<Reply, Infallible> {
    let path = request.uri().path().to_owned();
    let fence = request
        .headers()
        .get("x-fence")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let shown_fence = fence.clone().unwrap_or_else(|| "-".to_owned());
    let response = match request.method().clone() {
        Method::POST | Method::PUT | Method::PATCH => {
            let Ok(collected) = Limited::new(request.into_body(), MAX_BODY).collect().await else {
                return Ok(reply(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n"));
            };
            let body = collected.to_bytes();
            let mut entries = lock(&ledger);
            if entries.len() >= MAX_ENTRIES && !entries.contains_key(&path) {
                return Ok(reply(StatusCode::INSUFFICIENT_STORAGE, "ledger is full\n"));
            }
            entries.insert(path.clone(), body.clone());
            drop(entries);
            let stored = String::from_utf8_lossy(&body);
            // One line per write, whatever the body holds.
            let line = stored.replace(['\r', '\n'], " ");
            println!("write {path} fence={shown_fence} body={line}");
            let written = Written {
                path: &path,
                stored: &stored,
                fence: fence.as_deref(),
            };
            let json = serde_json::to_string(&written).unwrap_or_default();
            with_header(
                reply(StatusCode::OK, json),
                CONTENT_TYPE,
                "application/json",
            )
        }
        Method::GET => match lock(&ledger).get(&path) {
            Some(body) => reply(StatusCode::OK, body.clone()),
            None => reply(StatusCode::NOT_FOUND, "no such entry\n"),
        },
        Method::DELETE => {
            let removed = lock(&ledger).remove(&path);
            println!("delete {path} fence={shown_fence}");
            match removed {
                Some(_) => reply(StatusCode::NO_CONTENT, Bytes::new()),
                None => reply(StatusCode::NOT_FOUND, "no such entry\n"),
            }
        }
        _ => {
            let response = reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            with_header(response, ALLOW, "GET, POST, PUT, PATCH, DELETE")
        }
    };
    Ok(response)
}

/// The map, even if a handler panicked while holding it: every update is a single insert or remove.
fn lock(ledger: &Ledger) -> MutexGuard<'_, HashMap<String, Bytes>> {
    ledger.lock().unwrap_or_else(PoisonError::into_inner)
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

fn with_header(mut response: Reply, name: HeaderName, value: &'static str) -> Reply {
    let value = HeaderValue::from_static(value);
    response.headers_mut().insert(name, value);
    response
}
