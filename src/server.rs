//! The data-plane listener: accepts connections up to `max_connections` (refusing the rest with a
//! 503), completes the TLS handshake when `[server.tls]` is set (on the serving thread, within
//! its timeout), speaks HTTP/1.1 and HTTP/2 (ALPN, or h2c with prior knowledge) on each within the header and
//! stream limits and the connection timeouts, marks HTTP/1 requests framed by both
//! `Content-Length` and `Transfer-Encoding` for refusal, and on shutdown stops accepting and
//! drains in-flight requests. `request_head`, `response_head`, `response_body` and `http_date`
//! read heads and write heads, bodies and dates as hyper's server does, for the HTTP/1 server of the gateway's own that
//! is to replace it (issue 37).

mod activity;
mod admin_listener;
mod clock;
mod connection;
mod field_values;
mod framing;
pub mod http_date;
mod in_place;
mod refusal;
pub mod request_head;
pub mod response_body;
pub mod response_head;
mod tracked;
mod watched_stream;
mod workers;

pub use admin_listener::serve_admin;
pub use clock::{ConnectionTimeouts, Expiry};

pub use crate::extensions::AmbiguousFraming;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use prometheus::IntGauge;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;

use crate::config::ServerConfig;
use crate::gateway::Gateway;
use crate::metrics::Metrics;
use crate::proxy::ClientAddr;
use crate::tls::ListenerTls;

use activity::ConnectionActivity;
use in_place::InPlace;
use tracked::Tracked;
use watched_stream::{FramingWatch, WatchedStream};
pub use workers::Workers;

/// HTTP/2 flow-control windows offered to clients (hyper's defaults, set here so that the
/// memory a connection can make the gateway hold is stated in one place, docs/security.md):
/// request data received but not yet read is at most the connection window per connection.
const HTTP2_CONNECTION_WINDOW: u32 = 1024 * 1024;
const HTTP2_STREAM_WINDOW: u32 = 1024 * 1024;
/// Response data queued per HTTP/2 stream for a client whose window is full (hyper's default is
/// 400 KiB).
const HTTP2_MAX_SEND_BUFFER: usize = 64 * 1024;
/// Refusals being written at once; past this a connection over the limit is closed unanswered,
/// so a connection flood cannot make the refusals themselves pile up.
const MAX_CONCURRENT_REFUSALS: usize = 64;
/// The number of header fields hyper's HTTP/1 server accepts when given no limit of its own
/// (`DEFAULT_MAX_HEADERS` in hyper 1.x); `tests/gateway/limits.rs` checks that 100 fields pass and 101
/// are refused under the default configuration.
const HYPER_MAX_HEADERS: usize = 100;

/// The listener's limits and serving threads, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub max_concurrent_streams: u32,
    pub timeouts: ConnectionTimeouts,
    pub workers: usize,
}

impl ServerLimits {
    pub fn from_config(server: &ServerConfig) -> ServerLimits {
        ServerLimits {
            max_connections: server.max_connections,
            max_header_bytes: server.max_header_bytes,
            max_headers: server.max_headers,
            max_concurrent_streams: server.max_concurrent_streams,
            timeouts: ConnectionTimeouts::from_config(server),
            workers: server.worker_count(),
        }
    }
}

/// hyper's own HTTP/1 head timer starts when it begins waiting for a head, which on a kept-alive
/// connection is the end of the last response: a backstop behind the connection's clock.
fn hyper_head_timeout(timeouts: &ConnectionTimeouts) -> Duration {
    timeouts.idle + timeouts.head
}

/// Serves on `listener` until `shutdown` resolves, then drains for at most `grace`. Accepts here;
/// each connection is served on one of `limits.workers` threads, with that thread's gateway from
/// `gateway`. Returns the threads, to be dropped (stopped) once nothing uses them any more.
pub async fn serve(
    listener: TcpListener,
    gateway: impl Fn() -> Gateway,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    limits: ServerLimits,
    tls: Option<Arc<ListenerTls>>,
    metrics: Arc<Metrics>,
) -> Option<Workers> {
    let workers = match Workers::start(limits.workers, gateway) {
        Ok(workers) => workers,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the serving threads");
            return None;
        }
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper answers a head over these with 431 and closes (RFC 6585 §5).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(hyper_head_timeout(&limits.timeouts))
        .max_buf_size(limits.max_header_bytes);
    // hyper's own limit is 100 header fields, parsed into arrays on the stack. Any explicit limit,
    // even 100, makes it fill two heap vectors of that many slots for every request head (5 % of
    // a refused request's instructions in callgrind), so the default is left implicit.
    if limits.max_headers != HYPER_MAX_HEADERS {
        builder.http1().max_headers(limits.max_headers);
    }
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .max_send_buf_size(HTTP2_MAX_SEND_BUFFER)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_CONCURRENT_REFUSALS));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Typically EMFILE: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    metrics.connections_refused.inc();
                    tracing::debug!(%peer, "refused: max_connections are open");
                    if let Ok(writer) = Arc::clone(&refusals).try_acquire_owned() {
                        tokio::spawn(async move {
                            refusal::refuse_connection(stream).await;
                            drop(writer);
                        });
                    }
                    continue;
                };
                let open = OpenConnection::new(permit, metrics.open_connections.clone());
                let _ = stream.set_nodelay(true);
                let worker = workers.next();
                // The socket moves to the worker's I/O driver, so that its readiness wakes the
                // worker's thread, not this one.
                let stream = match stream.into_std().and_then(|stream| {
                    let _entered = worker.runtime.enter();
                    tokio::net::TcpStream::from_std(stream)
                }) {
                    Ok(stream) => stream,
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "handing a connection to a serving thread failed");
                        continue;
                    }
                };
                let connection = Connection {
                    gateway: worker.gateway.clone(),
                    client: ClientAddr::new(peer),
                    open,
                    limits,
                    closed: metrics.connections_closed.clone(),
                };
                match &tls {
                    None => {
                        worker
                            .runtime
                            .spawn(connection.serve(stream, &builder, graceful.watcher()));
                    }
                    Some(tls) => {
                        let acceptor = tls.acceptor();
                        let handshake_timeout = tls.handshake_timeout();
                        let builder = builder.clone();
                        let watcher = graceful.watcher();
                        worker.runtime.spawn(async move {
                            let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                                Ok(Ok(stream)) => stream,
                                Ok(Err(e)) => {
                                    connection.closed.with_label_values(&["data", "tls_handshake"]).inc();
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    connection.closed.with_label_values(&["data", "tls_handshake_timeout"]).inc();
                                    tracing::debug!(%peer, "TLS handshake timed out");
                                    return;
                                }
                            };
                            let connection = Connection {
                                client: connection.client.clone().over_tls(),
                                ..connection
                            };
                            connection.serve(stream, &builder, watcher).await;
                        });
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(grace = ?grace, "shutting down: draining in-flight requests");
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period ended with requests still in flight");
    }
    Some(workers)
}

/// A connection handed to its serving thread, before its stream is served.
struct Connection {
    gateway: Gateway,
    client: ClientAddr,
    open: OpenConnection,
    limits: ServerLimits,
    closed: prometheus::IntCounterVec,
}

impl Connection {
    /// Serves `stream` (plain TCP or a TLS session) under the connection's clock; the stream's
    /// bytes, decrypted, run through the framing scanner.
    fn serve<S>(
        self,
        stream: S,
        builder: &auto::Builder<TokioExecutor>,
        watcher: Watcher,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            gateway,
            client,
            open,
            limits,
            closed,
        } = self;
        let peer = client.addr;
        let watch = Arc::new(FramingWatch::default());
        let activity = Arc::new(ConnectionActivity::new());
        let stream = WatchedStream::new(
            stream,
            limits.max_header_bytes,
            Arc::clone(&watch),
            Arc::clone(&activity),
        );
        let service = gateway.map_request(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(client.clone());
            if request.version() <= http::Version::HTTP_11 && watch.next_request_is_ambiguous() {
                request.extensions_mut().insert(AmbiguousFraming);
            }
            request
        });
        let service = Tracked::new(service, Arc::clone(&activity));
        let connection = builder
            .serve_connection(TokioIo::new(stream), InPlace::new(service))
            .into_owned();
        let watched = watcher.watch(connection);
        let timeouts = limits.timeouts;
        async move {
            match connection::drive(watched, activity, timeouts, &closed, "data").await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                Err(expiry) => tracing::debug!(%peer, ?expiry, "connection closed"),
            }
            drop(open);
        }
    }
}

/// One open client connection: holds its `max_connections` permit and counts itself in the
/// open-connections gauge until it is dropped.
struct OpenConnection {
    _permit: OwnedSemaphorePermit,
    gauge: IntGauge,
}

impl OpenConnection {
    fn new(permit: OwnedSemaphorePermit, gauge: IntGauge) -> OpenConnection {
        gauge.inc();
        OpenConnection {
            _permit: permit,
            gauge,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
