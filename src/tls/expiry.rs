//! When a certificate stops being valid: the `notAfter` of a chain's leaf, read for the
//! `fencegate_certificate_expiry_timestamp_seconds` metric.

use rustls::pki_types::CertificateDer;

/// The leaf's `notAfter` in Unix seconds; `None` for an empty chain or a certificate that does
/// not parse (rustls has accepted it by then, so this does not happen with a working listener).
pub fn not_after(chain: &[CertificateDer<'_>]) -> Option<i64> {
    let leaf = chain.first()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(parsed.validity().not_after.timestamp())
}
