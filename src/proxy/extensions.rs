//! What the listener and the request's layers hand each other as request (and response)
//! extensions: a head with conflicting framing, the write the fence admitted, and an answer the
//! gateway replayed itself. A leaf: it depends on no other module of the crate.

/// Marks a request whose head carried both `Content-Length` and `Transfer-Encoding`; the
/// gateway refuses it before any layer runs.
#[derive(Debug, Clone, Copy)]
pub struct AmbiguousFraming;

/// A fenced write past the fence's checks: its resource key and token. Once the layer that owns
/// its route's advance (`CompiledRoute::advance_by`) has passed it on, its mark has been advanced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub key: String,
    pub token: u64,
}

/// Marks a response the idempotency layer replayed from a stored outcome, as opposed to a
/// provider's answer that carries the provider's own replay header: metrics and logs count the
/// two apart.
#[derive(Debug, Clone, Copy)]
pub struct GatewayReplay;
