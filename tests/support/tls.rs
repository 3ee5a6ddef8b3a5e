//! Real TLS peers for tests: a throw-away CA (rcgen, ring) issuing server and client certificates
//! (valid, expired, for other names), an HTTPS upstream that records what it saw and how many
//! connections it accepted, and an HTTPS client for the gateway's TLS listener.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use super::client::Reply;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate authority that exists for one test.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
    pub pem: String,
}

/// A certificate with its key, in PEM.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        let pem = cert.pem();
        TestCa { cert, key, pem }
    }

    /// A certificate for `names` (DNS names or IP addresses), valid from yesterday for a year,
    /// usable by a server and a client.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        let now = time_now();
        self.issue(names, now - DAY, now + 365 * DAY)
    }

    /// A certificate for `names` valid from yesterday until `not_after` (Unix seconds).
    pub fn leaf_until(&self, names: &[&str], not_after: i64) -> Leaf {
        let until = time::OffsetDateTime::from_unix_timestamp(not_after).expect("a valid time");
        self.issue(names, time_now() - DAY, until)
    }

    /// A certificate for `names` that expired yesterday.
    pub fn expired_leaf(&self, names: &[&str]) -> Leaf {
        let now = time_now();
        self.issue(names, now - 30 * DAY, now - DAY)
    }

    fn issue(
        &self,
        names: &[&str],
        not_before: time::OffsetDateTime,
        not_after: time::OffsetDateTime,
    ) -> Leaf {
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .expect("leaf params");
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            names.first().copied().unwrap_or("leaf"),
        );
        params.not_before = not_before;
        params.not_after = not_after;
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

const DAY: std::time::Duration = std::time::Duration::from_secs(86_400);

fn time_now() -> time::OffsetDateTime {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    time::OffsetDateTime::UNIX_EPOCH + since
}

/// Writes `text` to `dir/name`, returning the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a TLS file");
    path
}

impl Leaf {
    /// Writes `name.crt` and `name.key` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        (
            write(dir, &format!("{name}.crt"), &self.cert_pem),
            write(dir, &format!("{name}.key"), &self.key_pem),
        )
    }

    fn chain(&self) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate PEM")
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("key PEM")
    }
}

fn roots(ca_pem: &str) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA certificate");
    }
    roots
}

/// Client settings trusting `ca_pem`, presenting `identity` when given, offering `alpn`.
pub fn client_config(
    ca_pem: &str,
    identity: Option<&Leaf>,
    alpn: &[&[u8]],
) -> rustls::ClientConfig {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots(ca_pem));
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(leaf) => builder
            .with_client_auth_cert(leaf.chain(), leaf.key())
            .expect("client identity"),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// Server settings with `leaf`, requiring client certificates from `client_ca` when given.
pub fn server_config(leaf: &Leaf, client_ca: Option<&str>, alpn: &[&[u8]]) -> rustls::ServerConfig {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)),
                provider(),
            )
            .build()
            .expect("client verifier"),
        ),
    };
    let mut config = builder
        .with_single_cert(leaf.chain(), leaf.key())
        .expect("server certificate");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// One request as the HTTPS upstream saw it.
#[derive(Debug, Clone)]
pub struct SeenTls {
    pub method: String,
    pub target: String,
    /// The request URI as received: the origin form on HTTP/1.1, absolute on HTTP/2.
    pub uri: String,
    pub version: http::Version,
    pub headers: HeaderMap,
}

/// An HTTPS upstream: answers 200 with a fixed `X-Upstream-Secret` header the route may strip.
pub struct TlsUpstream {
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<SeenTls>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsUpstream {
    /// Serves with `config` (its ALPN decides HTTP/1.1 or HTTP/2).
    pub async fn start(config: rustls::ServerConfig) -> TlsUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let connections = Arc::new(AtomicUsize::new(0));
        let seen: Arc<Mutex<Vec<SeenTls>>> = Arc::default();
        let (count, record) = (Arc::clone(&connections), Arc::clone(&seen));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = service_fn(move |request: Request<Incoming>| {
                        let record = Arc::clone(&record);
                        async move {
                            let (parts, body) = request.into_parts();
                            let _ = body.collect().await;
                            record.lock().expect("record lock").push(SeenTls {
                                method: parts.method.to_string(),
                                target: parts
                                    .uri
                                    .path_and_query()
                                    .map_or("/".to_owned(), |pq| pq.to_string()),
                                uri: parts.uri.to_string(),
                                version: parts.version,
                                headers: parts.headers,
                            });
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .header("x-upstream-secret", "internal")
                                    .header("content-type", "text/plain")
                                    .body(Full::new(Bytes::from_static(b"charged")))
                                    .expect("response"),
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        TlsUpstream {
            addr,
            connections,
            seen,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<SeenTls> {
        self.seen.lock().expect("record lock").clone()
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends one request over TLS with `config` (on a fresh connection); the error chain as text
/// when no answer came.
pub async fn https_send(
    mut config: rustls::ClientConfig,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Reply, String> {
    let h2_only = config.alpn_protocols == [b"h2".to_vec()];
    // The connector sets ALPN itself, from the versions enabled below.
    config.alpn_protocols.clear();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only();
    let connector = if h2_only {
        connector.enable_http2().build()
    } else {
        connector.enable_http1().build()
    };
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    if h2_only {
        builder.http2_only(true);
    }
    let client = builder.build::<_, Full<Bytes>>(connector);
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let response = client.request(request).await.map_err(|e| error_chain(&e))?;
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| error_chain(&e))?
        .to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// An error and its sources, as one line.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// A raw TLS connection to `addr` (as `localhost`), trusting `ca_pem`, offering HTTP/1.1.
pub async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let connector =
        tokio_rustls::TlsConnector::from(Arc::new(client_config(ca_pem, None, &[b"http/1.1"])));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    connector
        .connect("localhost".try_into().expect("a server name"), tcp)
        .await
        .expect("TLS handshake")
}

/// `GET url` over HTTP/1.1 on a fresh TLS connection trusting `ca_pem`, presenting `identity`.
pub async fn https_get(ca_pem: &str, identity: Option<&Leaf>, url: &str) -> Result<Reply, String> {
    https_send(
        client_config(ca_pem, identity, &[b"http/1.1"]),
        "GET",
        url,
        &[],
        "",
    )
    .await
}
