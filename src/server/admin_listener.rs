//! The admin listener's accept loop: HTTP/1.1 only (over TLS when `[admin.tls]` is set), at most
//! `[admin] max_connections` at once (the rest answered 503 and closed, as on the data plane),
//! each connection under the same clock as the data plane's, so idle or silent admin connections
//! cannot pile up.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::activity::ConnectionActivity;
use super::clock::ConnectionTimeouts;
use super::refusal;
use super::tracked::Tracked;
use super::watched_stream::WatchedStream;
use crate::metrics::Metrics;
use crate::tls::ListenerTls;

/// Refusals being written at once on the admin listener.
const MAX_CONCURRENT_REFUSALS: usize = 16;

/// Serves `router` on `listener` until the task is dropped.
pub async fn serve_admin(
    listener: TcpListener,
    router: axum::Router,
    max_connections: usize,
    tls: Option<Arc<ListenerTls>>,
    timeouts: ConnectionTimeouts,
    metrics: Arc<Metrics>,
) {
    let connections = Arc::new(Semaphore::new(max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_CONCURRENT_REFUSALS));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.idle + timeouts.head);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            metrics.admin_connections_refused.inc();
            if let Ok(writer) = Arc::clone(&refusals).try_acquire_owned() {
                tokio::spawn(async move {
                    refusal::refuse_connection(stream).await;
                    drop(writer);
                });
            }
            continue;
        };
        let router = router.clone();
        let builder = builder.clone();
        let closed = metrics.connections_closed.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let outcome = match tls {
                None => serve_one(stream, router, &builder, timeouts, &closed).await,
                Some(tls) => {
                    let handshake = tls.acceptor().accept(stream);
                    match tokio::time::timeout(tls.handshake_timeout(), handshake).await {
                        Ok(Ok(stream)) => {
                            serve_one(stream, router, &builder, timeouts, &closed).await
                        }
                        Ok(Err(e)) => {
                            closed.with_label_values(&["admin", "tls_handshake"]).inc();
                            tracing::debug!(%peer, error = %e, "admin TLS handshake failed");
                            Ok(Ok(()))
                        }
                        Err(_) => {
                            closed
                                .with_label_values(&["admin", "tls_handshake_timeout"])
                                .inc();
                            tracing::debug!(%peer, "admin TLS handshake timed out");
                            Ok(Ok(()))
                        }
                    }
                }
            };
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "admin connection ended with an error")
                }
                Err(expiry) => tracing::debug!(%peer, ?expiry, "admin connection closed"),
            }
            drop(permit);
        });
    }
}

/// Serves one admin connection's stream (plain or TLS) under its clock.
async fn serve_one<S>(
    stream: S,
    router: axum::Router,
    builder: &http1::Builder,
    timeouts: ConnectionTimeouts,
    closed: &prometheus::IntCounterVec,
) -> Result<Result<(), hyper::Error>, super::clock::Expiry>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(ConnectionActivity::new());
    let stream = WatchedStream::new(stream, Arc::clone(&activity));
    let service = Tracked::new(router, Arc::clone(&activity));
    let connection =
        builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    super::connection::drive(connection, activity, timeouts, closed, "admin").await
}
