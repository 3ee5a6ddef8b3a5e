//! `[server.tls]`, `[admin.tls]`, `[routes.upstream_tls]` and `[store.tls]`: the files a TLS
//! connection is made with, and their defaults. The files are read and checked when the configuration compiles.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration;

/// How long a client may take to complete its TLS handshake before its connection is closed.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener's TLS: its certificate chain and key (PEM), and optionally the CA its clients'
/// certificates must chain to (mutual TLS).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsConfig {
    /// The certificate chain, end-entity certificate first.
    pub cert: PathBuf,
    /// The private key of that certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, a client must present a certificate issued by one of these CAs.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    #[serde(default = "default_handshake_timeout", with = "duration")]
    pub handshake_timeout: Duration,
}

/// A route's TLS to an `https://` upstream. Without the table the bundled web roots are trusted
/// and the URL's host is verified.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// Trust only the CAs in this PEM bundle (a private CA) instead of the web roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The name to verify in the upstream's certificate and send as SNI, when it is not the
    /// URL's host (an upstream addressed by IP, say).
    #[serde(default)]
    pub server_name: Option<String>,
    /// A client certificate to present to the upstream (mutual TLS), with its key.
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    #[serde(default)]
    pub client_key: Option<PathBuf>,
}

/// `[store.tls]`: TLS to a PostgreSQL or Redis store, on the same rustls stack as the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreTlsConfig {
    /// PostgreSQL only (Redis over TLS always verifies the name): how much of the server's
    /// certificate is checked. Default: `verify-full`.
    #[serde(default)]
    pub mode: Option<StoreTlsMode>,
    /// CAs to trust for the server's certificate. PostgreSQL trusts them besides the bundled web
    /// roots (as sqlx does); Redis trusts only them.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// A client certificate to present to the server (mutual TLS), with its key.
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    #[serde(default)]
    pub client_key: Option<PathBuf>,
}

/// PostgreSQL's `sslmode`, the values that encrypt for certain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreTlsMode {
    /// Encrypt, verify nothing (like libpq's `require`): protects only against passive listeners.
    Require,
    /// Verify the certificate chain, not the name.
    VerifyCa,
    /// Verify the chain and that the certificate names the host.
    VerifyFull,
}

fn default_handshake_timeout() -> Duration {
    DEFAULT_TLS_HANDSHAKE_TIMEOUT
}
