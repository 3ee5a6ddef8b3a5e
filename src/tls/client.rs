//! A route's TLS to its `https://` upstream, compiled once at load: whom to trust (the bundled
//! web roots, or the route's `ca_file` alone), the name to verify, and an optional client
//! certificate. Certificates are always verified; TLS 1.2 is the oldest version offered.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};

use super::pem::{load_certs, load_private_key, load_roots, TlsFileError};
use crate::config::UpstreamTlsConfig;

/// The compiled TLS settings of one route's upstream.
#[derive(Clone)]
pub struct UpstreamTls {
    /// Offers `h2` and `http/1.1` by ALPN: the upstream picks the version.
    pub config: Arc<ClientConfig>,
    /// The name verified in the upstream's certificate (and sent as SNI), when it is not the
    /// URL's host.
    pub server_name: Option<ServerName<'static>>,
    /// When the client certificate presented to the upstream expires (Unix seconds).
    pub client_not_after: Option<i64>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Why a route's upstream TLS settings cannot be used; the field is below `upstream_tls.`.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    #[error("{field}: {source}")]
    File {
        field: &'static str,
        source: TlsFileError,
    },
    #[error("server_name: {name:?} is not a DNS name or IP address")]
    ServerName { name: String },
    #[error("client_cert and client_key go together: set both or neither")]
    HalfClientIdentity,
    #[error("client_key: {0}")]
    ClientIdentity(rustls::Error),
    #[error("{0}")]
    Settings(rustls::Error),
}

impl UpstreamTlsError {
    /// The field of `[routes.upstream_tls]` at fault.
    pub fn field(&self) -> &'static str {
        match self {
            UpstreamTlsError::File { field, .. } => field,
            UpstreamTlsError::ServerName { .. } => "server_name",
            UpstreamTlsError::HalfClientIdentity | UpstreamTlsError::ClientIdentity(_) => {
                "client_key"
            }
            UpstreamTlsError::Settings(_) => "upstream_tls",
        }
    }
}

impl UpstreamTls {
    /// Reads and checks the files `config` names (relative paths against the working directory).
    pub fn compile(config: &UpstreamTlsConfig) -> Result<UpstreamTls, UpstreamTlsError> {
        let file = |field| move |source| UpstreamTlsError::File { field, source };
        let roots = match &config.ca_file {
            Some(path) => load_roots(path).map_err(file("ca_file"))?,
            None => RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        };
        let server_name = match &config.server_name {
            None => None,
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|_| UpstreamTlsError::ServerName { name: name.clone() })?,
            ),
        };
        let builder = ClientConfig::builder_with_provider(super::provider())
            .with_protocol_versions(super::PROTOCOL_VERSIONS)
            .map_err(UpstreamTlsError::Settings)?
            .with_root_certificates(roots);
        let mut client_not_after = None;
        let mut config_out = match (&config.client_cert, &config.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = load_certs(cert).map_err(file("client_cert"))?;
                let der = load_private_key(key).map_err(file("client_key"))?;
                check_pair(cert, key)?;
                client_not_after = super::not_after(&chain);
                builder
                    .with_client_auth_cert(chain, der)
                    .map_err(UpstreamTlsError::ClientIdentity)?
            }
            _ => return Err(UpstreamTlsError::HalfClientIdentity),
        };
        config_out.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(UpstreamTls {
            config: Arc::new(config_out),
            server_name,
            client_not_after,
        })
    }
}

/// The client key must belong to the client certificate (rustls would only find out in a
/// handshake, as the upstream's refusal).
fn check_pair(cert: &Path, key: &Path) -> Result<(), UpstreamTlsError> {
    super::pem::load_certified_key(cert, key)
        .map(drop)
        .map_err(|source| UpstreamTlsError::File {
            field: "client_key",
            source,
        })
}
