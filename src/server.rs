//! The data-plane listener: accepts connections, speaks HTTP/1.1 and HTTP/2 (h2c with prior
//! knowledge) on each, and on shutdown stops accepting and drains in-flight requests.

use std::future::Future;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt as _;

use crate::gateway::Gateway;
use crate::proxy::ClientAddr;

/// How long a client may take to send a request head before its connection is closed
/// (bounds slowloris-style connections).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `gateway` on `listener` until `shutdown` resolves, then drains for at most `grace`.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
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
                let _ = stream.set_nodelay(true);
                let client = ClientAddr::new(peer);
                let service = gateway.clone().map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(client.clone());
                    request
                });
                let connection = builder
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .into_owned();
                let watched = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = watched.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
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
}
