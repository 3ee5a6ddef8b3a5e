//! A listener's TLS (`[server.tls]`, `[admin.tls]`): its certificate and key, the ALPN protocols
//! it offers and, optionally, the CA its clients' certificates must chain to. The settings are
//! rebuilt from the files on reload; connections already open keep the ones they started with.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use super::pem::{load_certified_key, load_roots, TlsFileError};
use crate::config::ListenerTlsConfig;

/// Why a listener's TLS settings cannot be used; the field is below `tls.`.
#[derive(Debug, thiserror::Error)]
pub enum ListenerTlsError {
    #[error("{field}: {source}")]
    File {
        field: &'static str,
        source: TlsFileError,
    },
    #[error("client_ca: {0}")]
    ClientCa(String),
    #[error("{0}")]
    Settings(rustls::Error),
}

/// One listener's TLS settings, shared by its accept loop and the reload path.
pub struct ListenerTls {
    files: ListenerTlsConfig,
    alpn: Vec<Vec<u8>>,
    current: RwLock<Built>,
}

/// The settings in force and when their certificate expires (Unix seconds).
struct Built {
    server: Arc<ServerConfig>,
    not_after: Option<i64>,
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ListenerTls {
    /// A listener offering `alpn` (most preferred first), from the files `config` names.
    pub fn new(
        config: &ListenerTlsConfig,
        alpn: &[&[u8]],
    ) -> Result<ListenerTls, ListenerTlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let built = build(config, &alpn)?;
        Ok(ListenerTls {
            files: config.clone(),
            alpn,
            current: RwLock::new(built),
        })
    }

    /// The data plane's: HTTP/2 and HTTP/1.1.
    pub fn data_plane(config: &ListenerTlsConfig) -> Result<ListenerTls, ListenerTlsError> {
        ListenerTls::new(config, &[b"h2", b"http/1.1"])
    }

    /// The admin listener's: HTTP/1.1 only.
    pub fn admin(config: &ListenerTlsConfig) -> Result<ListenerTls, ListenerTlsError> {
        ListenerTls::new(config, &[b"http/1.1"])
    }

    /// An acceptor with the settings as of now.
    pub fn acceptor(&self) -> TlsAcceptor {
        let current = match self.current.read() {
            Ok(guard) => Arc::clone(&guard.server),
            Err(poisoned) => Arc::clone(&poisoned.into_inner().server),
        };
        TlsAcceptor::from(current)
    }

    /// When the certificate in force expires (Unix seconds).
    pub fn not_after(&self) -> Option<i64> {
        match self.current.read() {
            Ok(guard) => guard.not_after,
            Err(poisoned) => poisoned.into_inner().not_after,
        }
    }

    /// How long a client may take to complete its handshake.
    pub fn handshake_timeout(&self) -> Duration {
        self.files.handshake_timeout
    }

    /// Re-reads the certificate, key and client CA; on any error the settings in use stay.
    pub fn reload(&self) -> Result<(), ListenerTlsError> {
        let built = build(&self.files, &self.alpn)?;
        match self.current.write() {
            Ok(mut guard) => *guard = built,
            Err(poisoned) => *poisoned.into_inner() = built,
        }
        Ok(())
    }

    /// The certificate file, for log lines.
    pub fn cert_path(&self) -> &PathBuf {
        &self.files.cert
    }
}

fn build(config: &ListenerTlsConfig, alpn: &[Vec<u8>]) -> Result<Built, ListenerTlsError> {
    let certified =
        load_certified_key(&config.cert, &config.key).map_err(|source| ListenerTlsError::File {
            field: if source.path == config.cert {
                "cert"
            } else {
                "key"
            },
            source,
        })?;
    let builder = ServerConfig::builder_with_provider(super::provider())
        .with_protocol_versions(super::PROTOCOL_VERSIONS)
        .map_err(ListenerTlsError::Settings)?;
    let builder = match &config.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let roots = load_roots(path).map_err(|source| ListenerTlsError::File {
                field: "client_ca",
                source,
            })?;
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), super::provider())
                    .build()
                    .map_err(|e| ListenerTlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let not_after = super::not_after(&certified.cert);
    let mut server =
        builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
    server.alpn_protocols = alpn.to_vec();
    Ok(Built {
        server: Arc::new(server),
        not_after,
    })
}
