//! Idempotency for providers that cannot be fenced (docs/design.md §6): the same key on every
//! attempt, a durable intent before the call, replay of a known outcome. `settings.rs` compiles a
//! route's table, `key.rs` derives keys and fingerprints, `layer.rs` is the request flow (with
//! `admission.rs`, the fence's deferred advance made with the intent) and `capture.rs` records the
//! provider's answer as it streams to the client.

mod admission;
mod inject;
mod key;
mod layer;
pub mod reconcile;

pub use admission::IntentBackend;
pub use key::{decode_client_key, encode_key, fingerprint, idempotency_key};
pub use layer::{Idempotency, IdempotencyLayer};

/// Milliseconds since the Unix epoch, the clock intent records use.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
