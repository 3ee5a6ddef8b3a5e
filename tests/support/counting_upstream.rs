//! An HTTP/1.1 upstream that counts the TCP connections open to it (now and at their peak), waits
//! a fixed time before each answer, and answers with as many bytes as a request header asks for,
//! streamed from a static buffer so that a response of megabytes costs it no memory.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Header that makes the upstream answer with this many body bytes (2 without it).
pub const RESPONSE_BYTES_HEADER: &str = "x-test-response-bytes";

/// The answer's body length when the request does not name one.
const DEFAULT_RESPONSE_BYTES: u64 = 2;

/// What every response body is cut from.
static FILLER: [u8; 64 * 1024] = [b'r'; 64 * 1024];

#[derive(Default)]
struct Counts {
    open: AtomicUsize,
    peak: AtomicUsize,
    accepted: AtomicUsize,
    answered: AtomicUsize,
}

pub struct CountingUpstream {
    pub addr: SocketAddr,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingUpstream {
    /// Starts an upstream that answers every request `delay` after reading its whole body.
    pub async fn start(delay: Duration) -> CountingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream address");
        let counts: Arc<Counts> = Arc::default();
        let shared = Arc::clone(&counts);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let open = OpenConnection::new(Arc::clone(&shared));
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(answer(request, delay, &shared).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    drop(open);
                });
            }
        });
        CountingUpstream { addr, counts, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The most TCP connections that were open to this upstream at one time.
    pub fn peak_connections(&self) -> usize {
        self.counts.peak.load(Ordering::SeqCst)
    }

    /// TCP connections accepted so far.
    pub fn accepted_connections(&self) -> usize {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    /// Requests answered so far (their response head sent).
    pub fn answered(&self) -> usize {
        self.counts.answered.load(Ordering::SeqCst)
    }
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One accepted connection, counted open until its task ends.
struct OpenConnection {
    counts: Arc<Counts>,
}

impl OpenConnection {
    fn new(counts: Arc<Counts>) -> OpenConnection {
        counts.accepted.fetch_add(1, Ordering::SeqCst);
        let open = counts.open.fetch_add(1, Ordering::SeqCst) + 1;
        counts.peak.fetch_max(open, Ordering::SeqCst);
        OpenConnection { counts }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.counts.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn answer(request: Request<Incoming>, delay: Duration, counts: &Counts) -> Response<Filler> {
    let (parts, mut body) = request.into_parts();
    // Read (and drop) the whole body first, as a real service would before answering.
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    tokio::time::sleep(delay).await;
    let length = parts
        .headers
        .get(RESPONSE_BYTES_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_RESPONSE_BYTES);
    counts.answered.fetch_add(1, Ordering::SeqCst);
    Response::builder()
        .header("content-type", "application/octet-stream")
        .body(Filler { left: length })
        .expect("static response")
}

/// A body of `left` filler bytes, produced a buffer at a time as the connection takes them.
pub struct Filler {
    left: u64,
}

impl Body for Filler {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = usize::try_from(self.left).map_or(FILLER.len(), |left| left.min(FILLER.len()));
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&FILLER[..n])))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}
