//! TLS for every connection the gateway makes or accepts (docs/security.md): PEM files read and
//! checked once, the one crypto provider (ring), the client settings for `https://` upstreams and
//! for the stores, and the reloadable server settings of the listeners.

mod client;
mod expiry;
mod listener;
mod pem;
mod rejection;
mod store;

pub use client::{UpstreamTls, UpstreamTlsError};
pub use expiry::not_after;
pub use listener::{ListenerTls, ListenerTlsError};
pub use pem::{load_certified_key, load_certs, load_private_key, load_roots, TlsFileError};
pub use rejection::{certificate_rejection, CertificateRejection};
pub use store::{read_ca, read_client_identity, ClientIdentity, StoreTls, StoreTlsError};

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The crypto provider of every TLS configuration fencegate builds itself: ring, passed explicitly
/// rather than installed process-wide.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// TLS 1.2 and 1.3: the versions every configuration offers (nothing older).
pub const PROTOCOL_VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];
