//! Opening one connection to an upstream: a slot and a TCP connection (`upstream_slots.rs`),
//! then, for `https://` upstreams, TLS with the route's settings, offering `h2` and `http/1.1` by
//! ALPN; then, for HTTP/2, hyper's handshake, its connection task spawned on this thread. An
//! HTTP/1.1 connection needs no handshake and no task: the gateway's own client drives it.

use std::sync::Arc;

use http::Uri;
use hyper::client::conn::http2;
use hyper::rt::{Read, Write};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;
use tower::Service as _;

use super::h1::H1Connection;
use super::upstream_slots::CappedConnector;
use crate::body::{BoxError, RequestBody};
use crate::tls::UpstreamTls;

/// A connection just opened, ready for its first request.
pub enum Opened {
    /// Lent to one request at a time.
    Http1(H1Connection),
    /// Shared by every request at once, one stream each.
    Http2(http2::SendRequest<RequestBody>),
}

/// How one pool opens its connections: over TCP, or over TLS with one route's settings.
pub struct Dialer {
    tcp: CappedConnector,
    tls: Option<TlsDial>,
}

struct TlsDial {
    connector: TlsConnector,
    /// The name to verify when it is not the URL's host.
    server_name: Option<ServerName<'static>>,
}

impl Dialer {
    /// Plain HTTP/1.1 over TCP.
    pub fn plain(tcp: CappedConnector) -> Dialer {
        Dialer { tcp, tls: None }
    }

    /// TLS with `tls`'s trust, name and client certificate, over TCP.
    pub fn tls(tcp: CappedConnector, tls: &UpstreamTls) -> Dialer {
        Dialer {
            tcp,
            tls: Some(TlsDial {
                connector: TlsConnector::from(Arc::clone(&tls.config)),
                server_name: tls.server_name.clone(),
            }),
        }
    }

    /// Whether its connections may be HTTP/2 (over TLS, when the upstream picks `h2`).
    pub fn may_agree_http2(&self) -> bool {
        self.tls.is_some()
    }

    /// Opens a connection to `target` (`scheme://host:port/`) and shakes hands on it.
    pub async fn open(&self, target: &Uri) -> Result<Opened, BoxError> {
        let tcp = self.tcp.clone().call(target.clone()).await?;
        let Some(tls) = &self.tls else {
            return Ok(Opened::Http1(H1Connection::new(tcp)));
        };
        let name = match &tls.server_name {
            Some(name) => name.clone(),
            None => host_name(target)?,
        };
        let stream = tls.connector.connect(name, tcp).await?;
        if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
            http2_handshake(TokioIo::new(stream))
                .await
                .map(Opened::Http2)
        } else {
            Ok(Opened::Http1(H1Connection::new(stream)))
        }
    }
}

/// The name verified in the certificate (and sent as SNI): the URL's host, without the brackets
/// of an IPv6 literal.
fn host_name(target: &Uri) -> Result<ServerName<'static>, BoxError> {
    let host = target.host().unwrap_or_default();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_owned()).map_err(|e| Box::new(e) as BoxError)
}

async fn http2_handshake<T>(io: T) -> Result<http2::SendRequest<RequestBody>, BoxError>
where
    T: Read + Write + Unpin + Send + 'static,
{
    // Its streams' tasks are spawned on this thread too (tokio's current-thread `spawn`).
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .handshake(io)
        .await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "upstream HTTP/2 connection ended with an error");
        }
    });
    Ok(sender)
}
