//! A store's `[store.tls]` table, read and checked: the CA bundle and client identity as the PEM
//! bytes the PostgreSQL and Redis clients take, each file parsed first (and the key matched to its
//! certificate) so that a bad file is a configuration error, not a failed connection later.

use std::path::Path;

use super::pem::{load_certified_key, load_roots, TlsFileError};
use crate::config::{StoreTlsConfig, StoreTlsMode};

/// A store's TLS files, checked.
#[derive(Clone)]
pub struct StoreTls {
    /// Default: verify the chain and the name.
    pub mode: StoreTlsMode,
    /// PEM of the CAs to trust, if any were named.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM of the client certificate chain and of its key (mutual TLS).
    pub client: Option<ClientIdentity>,
}

/// A client certificate chain and its key, as PEM.
#[derive(Clone)]
pub struct ClientIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for StoreTls {
    /// Names what is set, never a key's bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreTls")
            .field("mode", &self.mode)
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

/// A `[store.tls]` setting that cannot be used: the field below `store.` and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct StoreTlsError {
    pub field: &'static str,
    pub message: String,
}

impl StoreTlsError {
    pub fn new(field: &'static str, message: impl Into<String>) -> StoreTlsError {
        StoreTlsError {
            field,
            message: message.into(),
        }
    }
}

impl StoreTls {
    /// Reads and checks the files `config` names.
    pub fn load(config: &StoreTlsConfig) -> Result<StoreTls, StoreTlsError> {
        let ca_pem = match &config.ca_file {
            None => None,
            Some(path) => Some(read_ca(path, "tls.ca_file")?),
        };
        let client = read_client_identity(
            config.client_cert.as_deref(),
            config.client_key.as_deref(),
            ("tls.client_cert", "tls.client_key"),
        )?;
        Ok(StoreTls {
            mode: config.mode.unwrap_or(StoreTlsMode::VerifyFull),
            ca_pem,
            client,
        })
    }
}

/// The PEM bytes of a CA bundle, after checking that every certificate in it can be a trust anchor.
pub fn read_ca(path: &Path, field: &'static str) -> Result<Vec<u8>, StoreTlsError> {
    let file_error = |e: TlsFileError| StoreTlsError::new(field, e.to_string());
    load_roots(path).map_err(file_error)?;
    std::fs::read(path)
        .map_err(|e| StoreTlsError::new(field, format!("{}: cannot read it: {e}", path.display())))
}

/// A client certificate and key, both or neither, checked to belong together. `fields` name the
/// certificate's and the key's settings in errors.
pub fn read_client_identity(
    cert: Option<&Path>,
    key: Option<&Path>,
    fields: (&'static str, &'static str),
) -> Result<Option<ClientIdentity>, StoreTlsError> {
    let (cert, key) = match (cert, key) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => (cert, key),
        (Some(_), None) => {
            return Err(StoreTlsError::new(
                fields.1,
                "a client certificate needs its key",
            ))
        }
        (None, Some(_)) => {
            return Err(StoreTlsError::new(
                fields.0,
                "a client key needs its certificate",
            ))
        }
    };
    load_certified_key(cert, key).map_err(|e| {
        let field = if e.path == key { fields.1 } else { fields.0 };
        StoreTlsError::new(field, e.to_string())
    })?;
    let read = |path: &Path, field| {
        std::fs::read(path).map_err(|e| {
            StoreTlsError::new(field, format!("{}: cannot read it: {e}", path.display()))
        })
    };
    Ok(Some(ClientIdentity {
        cert_pem: read(cert, fields.0)?,
        key_pem: read(key, fields.1)?,
    }))
}
