//! Reading certificates and keys from PEM files, with errors that name the file and say what is
//! wrong with it; and the check that a key belongs to its certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

/// A TLS file that cannot be used: which file, and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct TlsFileError {
    pub path: PathBuf,
    pub reason: String,
}

fn file_error(path: &Path, reason: impl Into<String>) -> TlsFileError {
    TlsFileError {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

fn pem_error(path: &Path, error: rustls::pki_types::pem::Error) -> TlsFileError {
    match error {
        rustls::pki_types::pem::Error::Io(e) => file_error(path, format!("cannot read it: {e}")),
        other => file_error(path, format!("not valid PEM: {other}")),
    }
}

/// Every certificate in a PEM file, in order (the end-entity certificate first for a chain).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no CERTIFICATE block"));
    }
    Ok(certs)
}

/// The one private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            file_error(path, "holds no PRIVATE KEY block")
        }
        other => pem_error(path, other),
    })
}

/// A trust store holding every certificate of a PEM bundle (a private CA).
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsFileError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| file_error(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// A certificate chain and its key, checked to belong together and to be usable with the
/// provider's algorithms.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsFileError> {
    let chain = load_certs(cert)?;
    let der = load_private_key(key)?;
    let signing = super::provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| file_error(key, format!("not a usable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        file_error(
            key,
            format!(
                "does not belong to the certificate in {}: {e}",
                cert.display()
            ),
        )
    })?;
    Ok(Arc::new(certified))
}
