//! `[routes.fence]`: how a route checks tokens, and its defaults.

use std::time::Duration;

use serde::Deserialize;

use super::{byte_size, duration, AuthorityConfig};

/// Default header carrying the fencing token (docs/design.md §3).
pub const DEFAULT_FENCE_HEADER: &str = "X-Fence";
/// Default header carrying the lock authority's signature of key and token.
pub const DEFAULT_SIGNATURE_HEADER: &str = "X-Fence-Signature";
/// How long a fenced request waits for the store before it is refused with 503 (fail closed, I5).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an admitted request waits for its turn at the per-key gate before 503: several
/// typical upstream round trips, well under a client's own timeout.
pub const DEFAULT_GATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a serialized write's response is read ahead so that its key's turn can end when
/// the upstream is done, whatever the client does.
pub const DEFAULT_RESPONSE_READ_AHEAD: usize = 1024 * 1024;

/// `[routes.fence]`: how a route checks tokens.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceConfig {
    #[serde(default = "default_fence_header")]
    pub header: String,
    #[serde(default)]
    pub mode: FenceMode,
    #[serde(default)]
    pub compare: Compare,
    #[serde(default = "default_store_timeout", with = "duration")]
    pub store_timeout: Duration,
    #[serde(default)]
    pub on_store_error: OnStoreError,
    #[serde(default)]
    pub ordering: Ordering,
    /// How long an admitted request may wait for its key's earlier writes before 503.
    #[serde(default = "default_gate_timeout", with = "duration")]
    pub gate_timeout: Duration,
    /// Refuse a token more than this far above the key's current mark (0 for a new key), so a
    /// client cannot poison a key with a huge token; absent: no limit.
    #[serde(default)]
    pub max_advance: Option<u64>,
    /// Name of an environment variable holding the secret the lock authority signs tokens with;
    /// when set, unsigned or badly signed tokens are refused.
    #[serde(default)]
    pub signature_secret_env: Option<String>,
    /// A file holding that secret instead (a mounted secret); read again on every reload.
    #[serde(default)]
    pub signature_secret_file: Option<std::path::PathBuf>,
    /// The header carrying the signature (lower-case hex HMAC-SHA256 of `key\ntoken`).
    #[serde(default = "default_signature_header")]
    pub signature_header: String,
    /// With `ordering = "serialize"`: this much of the upstream's response is read ahead, so that
    /// when all of it fits the key's turn ends once the upstream is done.
    #[serde(default = "default_response_read_ahead", with = "byte_size")]
    pub response_read_ahead: usize,
    /// The lock service the route's tokens come from, watched by the gateway.
    #[serde(default)]
    pub authority: Option<AuthorityConfig>,
}

impl Default for FenceConfig {
    fn default() -> Self {
        FenceConfig {
            header: default_fence_header(),
            mode: FenceMode::default(),
            compare: Compare::default(),
            store_timeout: DEFAULT_STORE_TIMEOUT,
            on_store_error: OnStoreError::default(),
            ordering: Ordering::default(),
            gate_timeout: DEFAULT_GATE_TIMEOUT,
            max_advance: None,
            signature_secret_env: None,
            signature_secret_file: None,
            signature_header: default_signature_header(),
            response_read_ahead: DEFAULT_RESPONSE_READ_AHEAD,
            authority: None,
        }
    }
}

/// Whether writes of one key may be in flight to the upstream together (I4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// At most one forwarded write per key at a time, in admission order.
    #[default]
    Serialize,
    /// Admitted writes are forwarded at once, possibly overlapping.
    None,
}

/// What a fenced request does when the store fails or times out (I5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Refuse with 503: nothing unchecked reaches the upstream.
    #[default]
    FailClosed,
    /// Forward unchecked, and count it: availability over fencing, by explicit choice.
    FailOpen,
}

/// What a route does with tokens (docs/design.md §2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceMode {
    /// Refuse what fails the check.
    #[default]
    Enforce,
    /// Forward everything; count and log what enforce would refuse.
    Observe,
    /// A plain proxy route.
    Off,
}

/// Which tokens pass against a key's high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compare {
    /// `token >= mark`: one holder may write several times with one token.
    #[default]
    Monotonic,
    /// `token > mark`: every write needs a new generation.
    Strict,
}

fn default_gate_timeout() -> Duration {
    DEFAULT_GATE_TIMEOUT
}
fn default_store_timeout() -> Duration {
    DEFAULT_STORE_TIMEOUT
}
fn default_fence_header() -> String {
    DEFAULT_FENCE_HEADER.to_owned()
}
fn default_signature_header() -> String {
    DEFAULT_SIGNATURE_HEADER.to_owned()
}
fn default_response_read_ahead() -> usize {
    DEFAULT_RESPONSE_READ_AHEAD
}
