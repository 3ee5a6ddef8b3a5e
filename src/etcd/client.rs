//! The connection to an etcd cluster: its v3 API through the HTTP/JSON gateway every etcd member
//! serves on its client port (no protobuf compiler at build time, the same hyper and rustls as
//! the rest of the gateway), pooled keep-alive connections, the next endpoint when one cannot be
//! reached, and etcd's authentication tokens.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::wire::{AuthenticateRequest, AuthenticateResponse, ErrorBody, HasHeader, Header};
use crate::config::{EtcdStoreConfig, UpstreamTlsConfig};
use crate::tls::{StoreTlsError, UpstreamTls};

/// Largest answer read from etcd: a range of intent records with stored bodies stays well
/// below it; anything larger is an error, never buffered without bound.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// How long an idle pooled connection to etcd is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting to one endpoint may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The gRPC status etcd answers for a missing, expired or revoked authentication token.
const UNAUTHENTICATED: i32 = 16;

/// What went wrong talking to etcd. Only [`EtcdError::Connect`] is certain not to have reached
/// the cluster; every other failure of a write leaves its outcome unknown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EtcdError {
    #[error("{endpoint}: cannot connect: {detail}")]
    Connect { endpoint: String, detail: String },
    #[error("{endpoint}: no answer within {}ms", timeout.as_millis())]
    Timeout { endpoint: String, timeout: Duration },
    #[error("{endpoint}: the connection failed: {detail}")]
    Transport { endpoint: String, detail: String },
    #[error("{endpoint}: etcd answered {status}: {message}")]
    Refused {
        endpoint: String,
        status: StatusCode,
        code: i32,
        message: String,
    },
    #[error("{endpoint}: unreadable answer: {detail}")]
    Decode { endpoint: String, detail: String },
    #[error("{endpoint}: answered for cluster {found:016x}, not the cluster {expected:016x} this store opened")]
    OtherCluster {
        endpoint: String,
        expected: u64,
        found: u64,
    },
    #[error("etcd: {0}")]
    Protocol(String),
}

/// A user and password for etcd's authentication.
struct Credentials {
    name: String,
    password: String,
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// One cluster's client: cheap to share behind an `Arc`.
pub(crate) struct EtcdClient {
    http: HttpClient,
    endpoints: Vec<String>,
    /// The endpoint that answered last: requests start there.
    current: AtomicUsize,
    timeout: Duration,
    credentials: Option<Credentials>,
    token: RwLock<Option<Arc<str>>>,
    /// The cluster id of the first answer (0 until then); every later answer must carry it.
    cluster: AtomicU64,
}

/// Checks the endpoints and TLS settings as [`EtcdClient::new`] uses them, without connecting.
pub(crate) fn check_tls(config: &EtcdStoreConfig) -> Result<(), StoreTlsError> {
    tls_settings(config).map(drop)
}

fn tls_settings(config: &EtcdStoreConfig) -> Result<Option<UpstreamTls>, StoreTlsError> {
    let any_https = config.endpoints.iter().any(|e| e.starts_with("https://"));
    let Some(table) = &config.tls else {
        if !any_https {
            return Ok(None);
        }
        let web_roots = UpstreamTls::compile(&UpstreamTlsConfig::default())
            .map_err(|e| StoreTlsError::new("tls", e.to_string()))?;
        return Ok(Some(web_roots));
    };
    if !any_https {
        return Err(StoreTlsError::new(
            "tls",
            "the tls table needs https:// endpoints (http:// is plain TCP)",
        ));
    }
    if table.mode.is_some() {
        return Err(StoreTlsError::new(
            "tls.mode",
            "PostgreSQL only: etcd over TLS always verifies the server's certificate and name",
        ));
    }
    let upstream = UpstreamTlsConfig {
        ca_file: table.ca_file.clone(),
        server_name: None,
        client_cert: table.client_cert.clone(),
        client_key: table.client_key.clone(),
    };
    UpstreamTls::compile(&upstream)
        .map(Some)
        .map_err(|e| StoreTlsError::new(tls_field(e.field()), e.to_string()))
}

fn tls_field(field: &'static str) -> &'static str {
    match field {
        "ca_file" => "tls.ca_file",
        "client_cert" => "tls.client_cert",
        "client_key" => "tls.client_key",
        _ => "tls",
    }
}

impl EtcdClient {
    /// A client for `config`'s endpoints; connects on first use. `Err` names the setting that
    /// cannot be used.
    pub(crate) fn new(
        config: &EtcdStoreConfig,
        password: Option<String>,
    ) -> Result<EtcdClient, StoreTlsError> {
        let tls = tls_settings(config)?;
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        tcp.enforce_http(false);
        let mut tls_config = match tls {
            Some(tls) => rustls::ClientConfig::clone(&tls.config),
            // Plain endpoints only: the TLS settings are never used.
            None => UpstreamTls::compile(&UpstreamTlsConfig::default())
                .map(|t| rustls::ClientConfig::clone(&t.config))
                .map_err(|e| StoreTlsError::new("tls", e.to_string()))?,
        };
        // The connector offers ALPN itself, for the versions enabled below (HTTP/1.1 only).
        tls_config.alpn_protocols.clear();
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let http = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .build(connector);
        let credentials = match (&config.username, password) {
            (Some(name), Some(password)) => Some(Credentials {
                name: name.clone(),
                password,
            }),
            _ => None,
        };
        Ok(EtcdClient {
            http,
            endpoints: config
                .endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_owned())
                .collect(),
            current: AtomicUsize::new(0),
            timeout: config.request_timeout,
            credentials,
            token: RwLock::new(None),
            cluster: AtomicU64::new(0),
        })
    }

    /// From now on every answer must come from `cluster` (the cluster of the adopted store).
    pub(crate) fn expect_cluster(&self, cluster: u64) {
        self.cluster.store(cluster, Ordering::Release);
    }

    /// Posts `body` to the API `path` (e.g. `/v3/kv/txn`) and reads the answer. An endpoint that
    /// cannot be connected to is passed over for the next; a missing or expired authentication
    /// token is renewed once (the request was refused before it ran).
    pub(crate) async fn call<Req, Resp>(&self, path: &str, body: &Req) -> Result<Resp, EtcdError>
    where
        Req: Serialize,
        Resp: DeserializeOwned + HasHeader,
    {
        let body =
            Bytes::from(serde_json::to_vec(body).map_err(|e| EtcdError::Protocol(e.to_string()))?);
        let mut renewed = false;
        loop {
            let token = self.token_for_request().await?;
            match self.send_to_any(path, body.clone(), token.as_deref()).await {
                Err(EtcdError::Refused { code, .. })
                    if code == UNAUTHENTICATED && self.credentials.is_some() && !renewed =>
                {
                    self.forget_token();
                    renewed = true;
                }
                Err(e) => return Err(e),
                Ok((endpoint, bytes)) => {
                    let answer: Resp =
                        serde_json::from_slice(&bytes).map_err(|e| EtcdError::Decode {
                            endpoint: endpoint.clone(),
                            detail: e.to_string(),
                        })?;
                    self.check_cluster(&endpoint, answer.header())?;
                    return Ok(answer);
                }
            }
        }
    }

    /// Posts `body` to a streaming API `path` (`/v3/watch`) and answers with the stream once
    /// etcd accepted it. Endpoints and authentication as for [`EtcdClient::call`].
    pub(crate) async fn stream<Req: Serialize>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<AnswerStream, EtcdError> {
        let body =
            Bytes::from(serde_json::to_vec(body).map_err(|e| EtcdError::Protocol(e.to_string()))?);
        let mut renewed = false;
        loop {
            let token = self.token_for_request().await?;
            let start = self.current.load(Ordering::Relaxed);
            let count = self.endpoints.len().max(1);
            let mut outcome = None;
            for step in 0..count {
                let index = (start + step) % count;
                let Some(endpoint) = self.endpoints.get(index) else {
                    break;
                };
                match self
                    .open_stream(endpoint, path, body.clone(), token.as_deref())
                    .await
                {
                    Err(e @ EtcdError::Connect { .. }) => outcome = Some(Err(e)),
                    other => {
                        if step > 0 {
                            self.current.store(index, Ordering::Relaxed);
                        }
                        outcome = Some(other);
                        break;
                    }
                }
            }
            match outcome {
                Some(Err(EtcdError::Refused { code, .. }))
                    if code == UNAUTHENTICATED && self.credentials.is_some() && !renewed =>
                {
                    self.forget_token();
                    renewed = true;
                }
                Some(answer) => return answer,
                None => return Err(EtcdError::Protocol("no endpoints configured".to_owned())),
            }
        }
    }

    async fn open_stream(
        &self,
        endpoint: &str,
        path: &str,
        body: Bytes,
        token: Option<&str>,
    ) -> Result<AnswerStream, EtcdError> {
        let request = post(endpoint, path, body, token)?;
        let response = tokio::time::timeout(self.timeout, self.http.request(request))
            .await
            .map_err(|_| EtcdError::Timeout {
                endpoint: endpoint.to_owned(),
                timeout: self.timeout,
            })?
            .map_err(|e| transport_error(endpoint, &e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(AnswerStream {
                endpoint: endpoint.to_owned(),
                body: response.into_body(),
                buffer: Vec::new(),
            });
        }
        let bytes = tokio::time::timeout(
            self.timeout,
            Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect(),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|b| b.to_bytes())
        .unwrap_or_default();
        Err(refusal(endpoint, status, &bytes))
    }

    /// The token to send, authenticating first when there is none yet.
    async fn token_for_request(&self) -> Result<Option<Arc<str>>, EtcdError> {
        let Some(credentials) = &self.credentials else {
            return Ok(None);
        };
        if let Some(token) = self
            .token
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(Some(token));
        }
        let request = AuthenticateRequest {
            name: credentials.name.clone(),
            password: credentials.password.clone(),
        };
        let body = Bytes::from(
            serde_json::to_vec(&request).map_err(|e| EtcdError::Protocol(e.to_string()))?,
        );
        let (endpoint, bytes) = self
            .send_to_any("/v3/auth/authenticate", body, None)
            .await?;
        let answer: AuthenticateResponse =
            serde_json::from_slice(&bytes).map_err(|e| EtcdError::Decode {
                endpoint,
                detail: e.to_string(),
            })?;
        let token: Arc<str> = answer.token.into();
        *self.token.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&token));
        Ok(Some(token))
    }

    fn forget_token(&self) {
        *self.token.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn check_cluster(&self, endpoint: &str, header: &Header) -> Result<(), EtcdError> {
        if header.cluster_id == 0 {
            return Ok(());
        }
        match self.cluster.compare_exchange(
            0,
            header.cluster_id,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Ok(()),
            Err(expected) if expected == header.cluster_id => Ok(()),
            Err(expected) => Err(EtcdError::OtherCluster {
                endpoint: endpoint.to_owned(),
                expected,
                found: header.cluster_id,
            }),
        }
    }

    /// Sends to the endpoint that answered last, then to each other one that cannot be
    /// connected to; answers with the endpoint that answered and the body.
    async fn send_to_any(
        &self,
        path: &str,
        body: Bytes,
        token: Option<&str>,
    ) -> Result<(String, Bytes), EtcdError> {
        let start = self.current.load(Ordering::Relaxed);
        let count = self.endpoints.len().max(1);
        let mut last = None;
        for step in 0..count {
            let index = (start + step) % count;
            let Some(endpoint) = self.endpoints.get(index) else {
                break;
            };
            match self.send(endpoint, path, body.clone(), token).await {
                Err(e @ EtcdError::Connect { .. }) => {
                    tracing::warn!(error = %e, "etcd store: endpoint unreachable, trying the next");
                    last = Some(e);
                }
                other => {
                    if step > 0 {
                        self.current.store(index, Ordering::Relaxed);
                    }
                    return other.map(|bytes| (endpoint.clone(), bytes));
                }
            }
        }
        Err(last.unwrap_or_else(|| EtcdError::Protocol("no endpoints configured".to_owned())))
    }

    async fn send(
        &self,
        endpoint: &str,
        path: &str,
        body: Bytes,
        token: Option<&str>,
    ) -> Result<Bytes, EtcdError> {
        let request = post(endpoint, path, body, token)?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| transport_error(endpoint, &e))?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| EtcdError::Transport {
                    endpoint: endpoint.to_owned(),
                    detail: e.to_string(),
                })?
                .to_bytes();
            if status.is_success() {
                return Ok(bytes);
            }
            Err(refusal(endpoint, status, &bytes))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(EtcdError::Timeout {
                endpoint: endpoint.to_owned(),
                timeout: self.timeout,
            }),
        }
    }
}

/// The answers etcd streams to one request (a watch): JSON objects, one per line, read as they
/// come. Dropping it closes the stream.
pub(crate) struct AnswerStream {
    endpoint: String,
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
}

impl AnswerStream {
    /// The next answer; `None` when etcd closed the stream.
    pub(crate) async fn next<T: DeserializeOwned>(&mut self) -> Option<Result<T, EtcdError>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(
                    serde_json::from_slice(&line).map_err(|e| EtcdError::Decode {
                        endpoint: self.endpoint.clone(),
                        detail: e.to_string(),
                    }),
                );
            }
            if self.buffer.len() > MAX_ANSWER_BYTES {
                return Some(Err(EtcdError::Protocol(format!(
                    "{}: a streamed answer above {MAX_ANSWER_BYTES} bytes",
                    self.endpoint
                ))));
            }
            match self.body.frame().await {
                None => return None,
                Some(Err(e)) => {
                    return Some(Err(EtcdError::Transport {
                        endpoint: self.endpoint.clone(),
                        detail: e.to_string(),
                    }))
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// The POST of `body` to `path` on `endpoint`, with the authentication token if there is one.
fn post(
    endpoint: &str,
    path: &str,
    body: Bytes,
    token: Option<&str>,
) -> Result<Request<Full<Bytes>>, EtcdError> {
    let mut request =
        Request::post(format!("{endpoint}{path}")).header(CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(AUTHORIZATION, token);
    }
    request
        .body(Full::new(body))
        .map_err(|e| EtcdError::Protocol(format!("{endpoint}{path}: {e}")))
}

/// A request that failed before an answer: `Connect` when it never reached the endpoint.
fn transport_error(endpoint: &str, error: &hyper_util::client::legacy::Error) -> EtcdError {
    let detail = error_chain(error);
    if error.is_connect() {
        EtcdError::Connect {
            endpoint: endpoint.to_owned(),
            detail,
        }
    } else {
        EtcdError::Transport {
            endpoint: endpoint.to_owned(),
            detail,
        }
    }
}

/// etcd's error answer (`{"code", "message"}`) as an error.
fn refusal(endpoint: &str, status: StatusCode, body: &[u8]) -> EtcdError {
    let error: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let message = if error.message.is_empty() {
        error.error
    } else {
        error.message
    };
    EtcdError::Refused {
        endpoint: endpoint.to_owned(),
        status,
        code: error.code,
        message,
    }
}

/// An error and its sources, as one line: hyper's own message alone says only "client error".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
