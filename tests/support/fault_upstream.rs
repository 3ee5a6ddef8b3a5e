//! An upstream whose behaviour a test switches while traffic flows — answering, answering slowly,
//! refusing connections, resetting mid-body, never answering — that records every request the
//! moment it arrives, whatever happens to it afterwards.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{header, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The body every successful answer carries.
pub const OK_BODY: &[u8] = b"ok";
/// How long a mid-body reset waits after the first chunk, so the head and the chunk reach the
/// gateway before the RST does.
const RESET_AFTER: Duration = Duration::from_millis(50);

/// What the upstream does with the requests that arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFault {
    /// 200 `ok` at once.
    None,
    /// 200 `ok` after the delay.
    Slow(Duration),
    /// The listener is closed (connects are refused) and open connections are reset.
    Refuse,
    /// 200 with a `Content-Length` it never fulfils: one chunk, then RST.
    ResetMidBody,
    /// The head never comes; the request is held until the gateway gives up on it.
    NeverAnswer,
}

/// One request as it arrived (before the upstream decided what to do with it).
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The test's `x-seq` header.
    pub seq: Option<u64>,
    pub target: String,
    pub fence: Option<u64>,
    pub arrived: Instant,
}

#[derive(Default)]
struct Shared {
    arrivals: Mutex<Vec<Arrival>>,
    in_flight: AtomicUsize,
}

pub struct FaultyUpstream {
    pub addr: SocketAddr,
    fault: watch::Sender<UpstreamFault>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultyUpstream {
    pub async fn start() -> FaultyUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream address");
        let (fault, watcher) = watch::channel(UpstreamFault::None);
        let shared = Arc::<Shared>::default();
        let task = tokio::spawn(accept_loop(listener, addr, watcher, Arc::clone(&shared)));
        FaultyUpstream {
            addr,
            fault,
            shared,
            task,
        }
    }

    /// Switches the behaviour for requests arriving from now on.
    pub fn set(&self, fault: UpstreamFault) {
        self.fault.send_replace(fault);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn arrivals(&self) -> Vec<Arrival> {
        self.shared.arrivals.lock().expect("arrivals lock").clone()
    }

    /// Requests being handled right now.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for FaultyUpstream {
    fn drop(&mut self) {
        self.task.abort();
        self.fault.send_replace(UpstreamFault::Refuse);
    }
}

/// Accepts connections, except while refusing: then the listener is closed, and bound again on
/// the same address afterwards.
async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    mut fault: watch::Receiver<UpstreamFault>,
    shared: Arc<Shared>,
) {
    let mut listener = Some(listener);
    loop {
        if *fault.borrow_and_update() == UpstreamFault::Refuse {
            listener = None;
            if fault.changed().await.is_err() {
                return;
            }
            continue;
        }
        let bound = match listener.take() {
            Some(bound) => bound,
            None => match TcpListener::bind(addr).await {
                Ok(bound) => bound,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        tokio::select! {
            accepted = bound.accept() => {
                if let Ok((stream, _)) = accepted {
                    tokio::spawn(serve(stream, fault.clone(), Arc::clone(&shared)));
                }
            }
            changed = fault.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        listener = Some(bound);
    }
}

/// Serves one connection until it ends or the upstream starts refusing (then it is reset).
async fn serve(stream: TcpStream, mut fault: watch::Receiver<UpstreamFault>, shared: Arc<Shared>) {
    // Every close is abrupt (RST), as a crashing server's would be.
    let _ = stream.set_zero_linger();
    let watcher = fault.clone();
    let service = service_fn(move |request| {
        let shared = Arc::clone(&shared);
        let current = *watcher.borrow();
        async move { Ok::<_, Infallible>(answer(request, current, shared).await) }
    });
    tokio::select! {
        _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service) => {}
        () = until_refusing(&mut fault) => {}
    }
}

async fn until_refusing(fault: &mut watch::Receiver<UpstreamFault>) {
    loop {
        if *fault.borrow_and_update() == UpstreamFault::Refuse {
            return;
        }
        if fault.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Counts a request in flight until its handler ends, however it ends.
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

type UpstreamBody = UnsyncBoxBody<Bytes, std::io::Error>;

async fn answer(
    request: Request<Incoming>,
    fault: UpstreamFault,
    shared: Arc<Shared>,
) -> Response<UpstreamBody> {
    let (parts, mut body) = request.into_parts();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    shared
        .arrivals
        .lock()
        .expect("arrivals lock")
        .push(Arrival {
            seq: header("x-seq"),
            target: parts
                .uri
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .to_owned(),
            fence: header("x-fence"),
            arrived: Instant::now(),
        });
    shared.in_flight.fetch_add(1, Ordering::SeqCst);
    let _in_flight = InFlight(Arc::clone(&shared));
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    match fault {
        UpstreamFault::None => {}
        UpstreamFault::Slow(delay) => tokio::time::sleep(delay).await,
        // Refuse: a request that slipped in on an open connection is reset with it.
        UpstreamFault::NeverAnswer | UpstreamFault::Refuse => std::future::pending::<()>().await,
        UpstreamFault::ResetMidBody => return reset_mid_body(),
    }
    let body = Full::new(Bytes::from_static(OK_BODY))
        .map_err(|never| match never {})
        .boxed_unsync();
    Response::new(body)
}

/// A 200 whose body promises 64 bytes, sends 8, then fails: hyper drops the connection, and the
/// zero linger turns that into a reset.
fn reset_mid_body() -> Response<UpstreamBody> {
    let first = futures_util::stream::iter([Ok::<_, std::io::Error>(Frame::data(
        Bytes::from_static(b"partial-"),
    ))]);
    let then_reset = futures_util::stream::once(async {
        tokio::time::sleep(RESET_AFTER).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "upstream reset mid-body",
        ))
    });
    let body = StreamBody::new(first.chain(then_reset)).boxed_unsync();
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_LENGTH,
        header::HeaderValue::from_static("64"),
    );
    response
}
