//! etcd's v3 API through the HTTP/JSON gateway every member serves: the connection
//! (`client.rs`: endpoints, TLS, authentication, one call or a stream of answers) and the
//! messages (`wire.rs`). The etcd store and the etcd lock authority both talk through it.

pub(crate) mod client;
pub(crate) mod wire;
