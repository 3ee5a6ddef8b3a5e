//! The data-plane listener: accepts connections up to `max_connections` (refusing the rest with a
//! 503), completes the TLS handshake when `[server.tls]` is set (on the serving thread, within
//! its timeout), and serves each connection under its timeouts: HTTP/2 (the preface, by ALPN or
//! prior knowledge) with hyper's server, HTTP/1.x with the gateway's own (`http1`, reading and
//! writing by hyper's rules, `request_head` to `response_body`). On shutdown it stops accepting
//! and drains in-flight requests.

mod activity;
#[cfg(feature = "admin")]
mod admin_listener;
mod client_io;
mod clock;
mod connection;
mod drain;
mod field_values;
mod http1;
pub mod http_date;
mod in_place;
mod refusal;
mod request_body;
pub mod request_head;
pub mod response_body;
pub mod response_head;
mod stopping;
mod tracked;
mod watched_stream;
mod workers;

#[cfg(feature = "admin")]
pub use admin_listener::serve_admin;
pub use clock::{ConnectionTimeouts, Expiry};
pub use stopping::Stopping;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut as _, BytesMut};
use http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus::IntGauge;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;

use crate::body::BoxError;
use crate::config::ServerConfig;
use crate::gateway::Gateway;
use crate::metrics::Metrics;
use crate::proxy::ClientAddr;
use crate::tls::ListenerTls;

use activity::ConnectionActivity;
use client_io::{protocol_of, Prefixed, Protocol, SplitIo};
use drain::{Drain, DrainWatcher};
use http1::{Http1Connection, Served};
use in_place::InPlace;
use request_body::READ_SPACE;
use tracked::Tracked;
use watched_stream::WatchedStream;
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
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .max_send_buf_size(HTTP2_MAX_SEND_BUFFER)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_CONCURRENT_REFUSALS));
    let drain = Drain::new();
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
                            .spawn(connection.serve(stream, &builder, drain.watcher()));
                    }
                    Some(tls) => {
                        let acceptor = tls.acceptor();
                        let handshake_timeout = tls.handshake_timeout();
                        let builder = builder.clone();
                        let watcher = drain.watcher();
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
    if tokio::time::timeout(grace, drain.drain()).await.is_err() {
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
    /// Serves `stream` (plain TCP or a TLS session) under the connection's clock: HTTP/2 when
    /// its first bytes are the HTTP/2 preface, else the gateway's HTTP/1 server.
    fn serve<S: SplitIo>(
        self,
        stream: S,
        http2: &http2::Builder<TokioExecutor>,
        drain: DrainWatcher,
    ) -> impl Future<Output = ()> + Send + 'static {
        let Connection {
            gateway,
            client,
            open,
            limits,
            closed,
        } = self;
        let peer = client.addr;
        let activity = Arc::new(ConnectionActivity::new());
        let served = Served {
            gateway,
            client,
            max_head_bytes: limits.max_header_bytes,
            max_headers: limits.max_headers,
            activity: Arc::clone(&activity),
            drain,
        };
        let serving = serve_stream(stream, http2.clone(), served);
        let timeouts = limits.timeouts;
        async move {
            match connection::drive(serving, activity, timeouts, &closed, "data").await {
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

/// Reads the first bytes of `stream`, then serves it with the protocol they say.
async fn serve_stream<S: SplitIo>(
    mut stream: S,
    http2: http2::Builder<TokioExecutor>,
    served: Served,
) -> Result<(), BoxError> {
    let mut first = BytesMut::with_capacity(READ_SPACE);
    let first_read = READ_SPACE.min(served.max_head_bytes.max(1));
    let protocol = {
        let sniffing = async {
            loop {
                match protocol_of(&first) {
                    Protocol::Undecided => {}
                    decided => return Ok(Some(decided)),
                }
                let room = first_read.saturating_sub(first.len()).max(1);
                let read = stream.read_buf(&mut (&mut first).limit(room)).await?;
                served.activity.note_read(read);
                if read == 0 {
                    return Ok::<_, std::io::Error>(None);
                }
            }
        };
        tokio::select! {
            sniffed = sniffing => sniffed?,
            () = served.drain.clone().draining() => None,
        }
    };
    match protocol {
        None => Ok(()),
        Some(Protocol::Http2) => serve_http2(stream, first, http2, served).await,
        Some(_) => {
            let (read, write) = stream.split_io();
            let activity = &served.activity;
            let read = WatchedStream::new(read, Arc::clone(activity));
            let write = WatchedStream::new(write, Arc::clone(activity));
            Http1Connection::new(read, write, first, served)
                .serve()
                .await
                .map_err(Into::into)
        }
    }
}

/// Serves an HTTP/2 connection whose first bytes, `first`, are read, with hyper's server.
async fn serve_http2<S: SplitIo>(
    stream: S,
    first: BytesMut,
    http2: http2::Builder<TokioExecutor>,
    served: Served,
) -> Result<(), BoxError> {
    let Served {
        gateway,
        client,
        activity,
        drain,
        ..
    } = served;
    activity.note_http2();
    let stream = Prefixed::new(first, WatchedStream::new(stream, Arc::clone(&activity)));
    let service = gateway.map_request(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(client.clone());
        request
    });
    let service = InPlace::new(Tracked::new(service, activity));
    let connection = http2.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => return served.map_err(Into::into),
        () = drain.draining() => {}
    }
    connection.as_mut().graceful_shutdown();
    connection.await.map_err(Into::into)
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
