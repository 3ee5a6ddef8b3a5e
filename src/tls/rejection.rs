//! Telling a failed upstream TLS handshake apart from other connect failures, and saying why it
//! failed in words an operator can act on (expired, unknown issuer, name mismatch, ...).

use std::error::Error as StdError;

use rustls::{CertificateError, Error as TlsError};

/// Why the upstream's TLS handshake failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateRejection {
    Expired,
    NotYetValid,
    UnknownIssuer,
    NameMismatch,
    Revoked,
    /// The certificate was refused for another reason, or the handshake failed on the way (the
    /// upstream refused our client certificate, no protocol version in common, ...).
    Other(String),
}

impl CertificateRejection {
    /// A short reason for the log line and the problem document.
    pub fn reason(&self) -> String {
        match self {
            CertificateRejection::Expired => "the upstream's certificate has expired".to_owned(),
            CertificateRejection::NotYetValid => {
                "the upstream's certificate is not valid yet".to_owned()
            }
            CertificateRejection::UnknownIssuer => {
                "the upstream's certificate is not signed by a trusted CA (unknown issuer)"
                    .to_owned()
            }
            CertificateRejection::NameMismatch => {
                "the upstream's certificate does not name the upstream's host (name mismatch)"
                    .to_owned()
            }
            CertificateRejection::Revoked => "the upstream's certificate is revoked".to_owned(),
            CertificateRejection::Other(text) => format!("TLS handshake failed: {text}"),
        }
    }
}

/// The TLS failure somewhere in `error`'s chain of sources, if the failure was one.
pub fn certificate_rejection(error: &(dyn StdError + 'static)) -> Option<CertificateRejection> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<TlsError>() {
            return Some(classify(tls));
        }
        // An `io::Error`'s `source()` skips the error it wraps: step into that one instead
        // (the connector wraps the handshake's `io::Error`, which wraps rustls's error).
        current = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

fn classify(error: &TlsError) -> CertificateRejection {
    match error {
        TlsError::InvalidCertificate(certificate) => match certificate {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                CertificateRejection::Expired
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                CertificateRejection::NotYetValid
            }
            CertificateError::UnknownIssuer => CertificateRejection::UnknownIssuer,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                CertificateRejection::NameMismatch
            }
            CertificateError::Revoked => CertificateRejection::Revoked,
            other => CertificateRejection::Other(format!("invalid certificate: {other:?}")),
        },
        other => CertificateRejection::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_found_under_nested_io_errors() {
        let tls = TlsError::InvalidCertificate(CertificateError::UnknownIssuer);
        let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let outer = std::io::Error::other(inner);
        assert_eq!(
            certificate_rejection(&outer),
            Some(CertificateRejection::UnknownIssuer)
        );
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(certificate_rejection(&plain), None);
    }
}
