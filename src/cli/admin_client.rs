//! The command line's client of a running gateway's admin listener: `fencegate health` probes
//! it, and `fencegate intents` reconciles through it when the embedded store is held by that
//! gateway. Plain HTTP/1.1, one connection per call, the bearer token from `[admin]`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};

use fencegate::config::AdminConfig;

/// How long one admin call may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an admin call did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    #[error("the admin listener {0} is served over TLS; the command line speaks plain HTTP to it only (use curl with the CA instead)")]
    Tls(SocketAddr),
    #[error("{0}")]
    NoToken(String),
    #[error("cannot reach the admin listener at {addr}: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("the admin listener at {0} did not answer within {CALL_TIMEOUT:?}")]
    Timeout(SocketAddr),
}

/// A running gateway's admin listener, as its configuration names it.
pub struct AdminClient {
    addr: SocketAddr,
    token: Option<String>,
}

/// An answer: the status and the whole body.
pub struct AdminAnswer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl AdminAnswer {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// What a problem document's `detail` says, or the body.
    pub fn detail(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_owned))
            .unwrap_or_else(|| self.text().trim().to_owned())
    }
}

impl AdminClient {
    /// The client of `admin`: an unspecified listen address (`0.0.0.0`, `::`) is reached on
    /// loopback.
    pub fn new(admin: &AdminConfig) -> Result<AdminClient, AdminClientError> {
        let mut addr = admin.listen;
        if admin.tls.is_some() {
            return Err(AdminClientError::Tls(addr));
        }
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        let token = admin
            .bearer_token()
            .map_err(|e| AdminClientError::NoToken(format!("admin.token: {e}")))?;
        Ok(AdminClient { addr, token })
    }

    /// The client of `admin`'s probes (`/healthz`, `/readyz`): it sends the token only when the
    /// probes require it, so a health check needs no secret otherwise.
    pub fn for_probes(admin: &AdminConfig) -> Result<AdminClient, AdminClientError> {
        if admin.probes_require_token {
            return AdminClient::new(admin);
        }
        let without_token = AdminConfig {
            token: None,
            token_env: None,
            token_file: None,
            ..admin.clone()
        };
        AdminClient::new(&without_token)
    }

    /// The listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET path` (path and query, already percent-encoded).
    pub async fn get(&self, path: &str) -> Result<AdminAnswer, AdminClientError> {
        self.call(Method::GET, path, None).await
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<AdminAnswer, AdminClientError> {
        self.call(Method::POST, path, Some(body.to_string())).await
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<AdminAnswer, AdminClientError> {
        tokio::time::timeout(CALL_TIMEOUT, self.exchange(method, path, body))
            .await
            .map_err(|_| AdminClientError::Timeout(self.addr))?
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<AdminAnswer, AdminClientError> {
        let unreachable = |reason: String| AdminClientError::Unreachable {
            addr: self.addr,
            reason,
        };
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| unreachable(e.to_string()))?;
        let driver = tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.addr.to_string());
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| unreachable(format!("request {path:?}: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        driver.abort();
        Ok(AdminAnswer { status, body })
    }
}
