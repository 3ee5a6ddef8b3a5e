//! Every kind of failure the gateway answers, and the one table that says, per kind, its status,
//! problem type, title, origin, whether and when a retry may help, and the level it is logged at.
//! A leaf: what a kind means never depends on which layer found it.

use http::StatusCode;

use super::problem::Problem;

/// Who caused a failure: decides whether a retry may help and how loudly it is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Client,
    Store,
    /// The lock service a route's tokens come from.
    Authority,
    Upstream,
    Gateway,
}

/// How loudly a failure is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Refusals a client can cause at will (a flood of them must not flood the log).
    Debug,
    /// Fence refusals: each is a stale or unauthorised holder an operator may want to see.
    Info,
    /// A dependency failed.
    Warn,
    /// A bug.
    Error,
}

/// What a client is told about retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Not without changing the request.
    No,
    /// `Retry-After: 1`: the condition is expected to clear (a store, a queue, a busy key).
    Soon,
    /// `Retry-After` from the failure itself (an intent still in flight).
    After,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct KindSpec {
    pub status: StatusCode,
    /// The problem type's slug, appended to `PROBLEM_TYPE_BASE`.
    pub slug: &'static str,
    pub title: &'static str,
    pub origin: Origin,
    pub retry: Retry,
    pub level: Level,
}

/// Every kind of failure, data plane and admin API alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    NoRoute,
    NoEndpoint,
    MethodNotAllowed,
    InvalidPath,
    InvalidMethod,
    InvalidHost,
    InvalidDestination,
    FencedDestination,
    FencedCollection,
    AmbiguousFraming,
    InvalidResourceKey,
    MissingFence,
    InvalidFence,
    MissingFenceSignature,
    InvalidFenceSignature,
    FenceTooFarAhead,
    StaleFence,
    LeaseEnded,
    AuthorityUnavailable,
    GateTimeout,
    TurnLapsed,
    StoreUntrusted,
    StoreUnavailable,
    StoreTimeout,
    UpstreamUnavailable,
    UpstreamTls,
    UpstreamCredentials,
    UpstreamResponseFailed,
    UpstreamTimeout,
    InvalidRequestBody,
    BodyTimeout,
    UpstreamBusy,
    MemoryBusy,
    BodyTooLarge,
    IdempotencyKeyRequired,
    IdempotencyKeyTooLong,
    IdempotencyKeyReused,
    RequestInProgress,
    OutcomeUnknown,
    Internal,
    // The admin API's own.
    Unauthorized,
    NoMark,
    MarkNotLowered,
    InvalidQuery,
    InvalidConfig,
    InvalidBody,
    InvalidKey,
    NoIntent,
    IntentNotSubmitting,
    NoSuchEndpoint,
}

impl ErrorKind {
    /// The table.
    #[rustfmt::skip]
    pub fn spec(self) -> KindSpec {
        use ErrorKind as K;
        use Level::{Debug, Error, Info, Warn};
        use Origin::{Authority, Client, Gateway, Store, Upstream};
        use Retry::{After, No, Soon};
        let (status, slug, title, origin, retry, level) = match self {
            K::NoRoute                => (404, "no-route", "No route matches", Client, No, Debug),
            K::NoEndpoint             => (404, "no-route", "No such gateway endpoint", Client, No, Debug),
            K::MethodNotAllowed       => (405, "method-not-allowed", "Method not allowed", Client, No, Debug),
            K::InvalidPath            => (400, "invalid-path", "Invalid path", Client, No, Debug),
            K::InvalidMethod          => (400, "invalid-method", "Invalid method", Client, No, Debug),
            K::InvalidHost            => (400, "invalid-host", "Invalid host", Client, No, Debug),
            K::InvalidDestination     => (400, "invalid-destination", "Invalid destination", Client, No, Debug),
            K::FencedDestination      => (403, "fenced-destination", "Destination on a fenced route", Client, No, Debug),
            K::FencedCollection       => (403, "fenced-collection", "Collection holding fenced resources", Client, No, Debug),
            K::AmbiguousFraming       => (400, "ambiguous-framing", "Ambiguous message framing", Client, No, Debug),
            K::InvalidResourceKey     => (400, "invalid-resource-key", "Resource key unavailable", Client, No, Debug),
            K::MissingFence           => (428, "missing-fence", "Fencing token required", Client, No, Info),
            K::InvalidFence           => (400, "invalid-fence", "Invalid fencing token", Client, No, Info),
            K::MissingFenceSignature  => (428, "missing-fence-signature", "Fencing token signature required", Client, No, Info),
            K::InvalidFenceSignature  => (403, "invalid-fence-signature", "Invalid fencing token signature", Client, No, Info),
            K::FenceTooFarAhead       => (409, "fence-too-far-ahead", "Fencing token too far ahead", Client, No, Info),
            K::StaleFence             => (409, "stale-fence", "Stale fencing token", Client, No, Info),
            K::LeaseEnded             => (409, "lease-ended", "Lock lease ended", Client, No, Info),
            K::AuthorityUnavailable   => (503, "authority-unavailable", "Lock authority unavailable", Authority, Soon, Warn),
            // Waiting for a busy key is the client's load, not a fault: logged as a refusal.
            K::GateTimeout            => (503, "gate-timeout", "Key busy", Client, Soon, Debug),
            K::TurnLapsed             => (503, "turn-lapsed", "Key turn ran out", Client, Soon, Debug),
            K::StoreUntrusted         => (503, "store-untrusted", "Fence store not trusted", Store, Soon, Warn),
            K::StoreUnavailable       => (503, "store-unavailable", "Fence store unavailable", Store, Soon, Warn),
            K::StoreTimeout           => (503, "store-unavailable", "Fence store unavailable", Store, Soon, Warn),
            K::UpstreamUnavailable    => (502, "upstream-unavailable", "Upstream unavailable", Upstream, No, Warn),
            K::UpstreamTls            => (502, "upstream-tls", "Upstream TLS verification failed", Upstream, No, Warn),
            K::UpstreamCredentials    => (502, "upstream-credentials", "Upstream credentials unavailable", Upstream, Soon, Warn),
            K::UpstreamResponseFailed => (502, "upstream-unavailable", "Upstream response failed", Upstream, No, Warn),
            K::UpstreamTimeout        => (504, "upstream-timeout", "Upstream timed out", Upstream, No, Warn),
            K::InvalidRequestBody     => (400, "invalid-request-body", "Request body malformed", Client, No, Debug),
            K::BodyTimeout            => (408, "body-timeout", "Request body too slow", Client, No, Debug),
            // Shedding load is logged like a client's error, at debug: a flood must not flood the
            // log too. The request counters show it.
            K::UpstreamBusy           => (503, "upstream-busy", "Upstream busy", Client, Soon, Debug),
            K::MemoryBusy             => (503, "memory-busy", "Gateway busy", Client, Soon, Debug),
            K::BodyTooLarge           => (413, "body-too-large", "Request body too large", Client, No, Debug),
            K::IdempotencyKeyTooLong  => (400, "idempotency-key-too-long", "Idempotency key too long", Client, No, Debug),
            K::IdempotencyKeyRequired => (400, "idempotency-key-required", "Idempotency key required", Client, No, Debug),
            K::IdempotencyKeyReused   => (422, "idempotency-key-reused", "Idempotency key reused", Client, No, Debug),
            K::RequestInProgress      => (409, "request-in-progress", "Request in progress", Client, After, Debug),
            K::OutcomeUnknown         => (409, "outcome-unknown", "Earlier outcome unknown", Upstream, No, Info),
            K::Internal               => (500, "internal", "Internal gateway error", Gateway, No, Error),
            K::Unauthorized           => (401, "unauthorized", "Bearer token required", Client, No, Debug),
            K::NoMark                 => (404, "no-mark", "No mark for this key", Client, No, Debug),
            K::MarkNotLowered         => (409, "marks-never-go-down", "Marks never go down", Client, No, Debug),
            K::InvalidQuery           => (400, "invalid-query", "Invalid query", Client, No, Debug),
            K::InvalidConfig          => (400, "invalid-config", "Configuration refused", Client, No, Warn),
            K::InvalidBody            => (400, "invalid-body", "Invalid request body", Client, No, Debug),
            K::InvalidKey             => (400, "invalid-key", "Invalid key in the path", Client, No, Debug),
            K::NoIntent               => (404, "no-intent", "No intent with this key", Client, No, Debug),
            K::IntentNotSubmitting    => (409, "intent-not-submitting", "Intent outcome already known", Client, No, Debug),
            K::NoSuchEndpoint         => (404, "no-such-endpoint", "No such admin endpoint", Client, No, Debug),
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        KindSpec { status, slug, title, origin, retry, level }
    }

    /// This kind's problem document, with `detail`.
    pub fn problem(self, detail: String) -> Problem {
        let spec = self.spec();
        Problem::new(spec.status, spec.slug, spec.title, detail)
    }
}
