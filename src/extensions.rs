//! What the listener and the request's layers hand each other as request (and response)
//! extensions: a head with conflicting framing, the write the fence admitted, and an answer the
//! gateway replayed itself; and who makes a fenced write's compare-and-advance (decided once, by
//! routing, and carried in the route match). A leaf: it depends on no other module of the crate.

/// Marks a request whose head carried both `Content-Length` and `Transfer-Encoding`; the
/// gateway refuses it before any layer runs.
#[derive(Debug, Clone, Copy)]
pub struct AmbiguousFraming;

/// Which layer makes a fenced write's compare-and-advance. Routing decides it once per request
/// from the route and the store and puts it in the route match; each layer asks only whether it
/// is the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdvanceBy {
    /// The fence, before anything else sees the request.
    #[default]
    Fence,
    /// The idempotency layer, together with beginning the write's intent (one store round
    /// where the backend has one).
    Intent,
    /// The ordering gate, in the store step that takes the key's cross-replica turn.
    Turn,
}

/// A fenced write past the fence's checks: its resource key and token. Once the layer named by
/// [`AdvanceBy`] has passed it on, its mark has been advanced.
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
