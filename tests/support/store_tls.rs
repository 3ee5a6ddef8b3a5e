//! The TLS servers `scripts/tls-setup.sh` starts for the store tests: PostgreSQL's own port with
//! `ssl` on and the test CA's certificate, a TLS-only Redis, and one that requires a client
//! certificate; and the throw-away CA, a second unrelated CA and a client certificate.

use std::path::PathBuf;

/// Where `scripts/tls-setup.sh` writes the certificates.
pub const TLS_DIR: &str = "/var/lib/fencegate-test-tls";
/// A TLS-only Redis (client certificates optional).
pub const REDIS_TLS_PORT: u16 = 6380;
/// A TLS-only Redis that requires a client certificate from the test CA.
pub const REDIS_MTLS_PORT: u16 = 6381;

/// A file of the test PKI: `ca.pem`, `other-ca.pem`, `client.pem`, `client.key`. Panics, naming
/// the script that makes them, when it is missing.
pub fn file(name: &str) -> PathBuf {
    let path = PathBuf::from(TLS_DIR).join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/tls-setup.sh (scripts/ensure-services.sh runs it)",
        path.display()
    );
    path
}

/// `file(name)` as a TOML string value.
pub fn toml_path(name: &str) -> String {
    format!("{:?}", file(name).display().to_string())
}
