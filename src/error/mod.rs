//! Every way a request can fail inside the gateway, as one value, [`RequestError`]: what went
//! wrong (a [`GatewayError`], with the figures it concerns, whose [`ErrorKind`] looks up
//! everything else in one table, `kind.rs`) and its context, each part attached once by the code
//! that knows it — the resource key where a key's token, mark, turn or store step failed, the
//! route by routing. It turns into the problem response (`answer.rs`, shared with the admin API)
//! and the log line in exactly one place.

mod answer;
mod kind;
mod problem;

pub use answer::{answer, Facts, X_FENCE_CURRENT};
pub use kind::{ErrorKind, KindSpec, Level, Origin, Retry};
pub use problem::{Problem, PROBLEM_TYPE_BASE};

use std::time::Duration;

use http::{HeaderName, HeaderValue, Response};

use crate::body::ProxyBody;
use crate::checks::{DestinationRefusal, HostRefusal};
use crate::request_id::RequestId;
use crate::route::{MethodRefusal, PathRefusal, RenderError};
use crate::store::StoreError;
use crate::token::{SignatureError, TokenError};

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("no route matches {path}")]
    NoRoute { path: String },
    #[error("{path} is reserved for the gateway and names nothing")]
    ReservedNotFound { path: String },
    #[error("method not allowed here; use {allow}")]
    MethodNotAllowed { allow: &'static str },
    #[error("{0}")]
    InvalidPath(PathRefusal),
    #[error("{0}")]
    InvalidMethod(MethodRefusal),
    #[error("{0}")]
    InvalidHost(HostRefusal),
    #[error("{0}")]
    Destination(DestinationRefusal),
    #[error("the path may name a collection holding resources of fenced route {fenced_route}; write them there with their own tokens instead")]
    FencedCollection { fenced_route: String },
    #[error("the claim path names no valid resource key")]
    BadClaimKey,
    #[error("the request names no resource key")]
    NoResourceKey,
    #[error(
        "the request carries both Content-Length and Transfer-Encoding; its framing is ambiguous"
    )]
    AmbiguousFraming,
    #[error("{error}")]
    KeyUnavailable { error: RenderError },
    #[error("{error}")]
    Token { error: TokenError },
    #[error("{error}")]
    Signature { error: SignatureError },
    #[error("token {token} is more than {max_advance} above the high-water mark {current}")]
    TooFarAhead {
        token: u64,
        current: u64,
        max_advance: u64,
    },
    #[error("token {token} is below the high-water mark {current}")]
    StaleFence { token: u64, current: u64 },
    #[error("token {token} is not the lock's current holder ({}): its lease ended", holder.map_or_else(|| "no one holds it".to_owned(), |h| format!("held with token {h}")))]
    LeaseEnded { token: u64, holder: Option<u64> },
    #[error("the lock authority cannot be consulted: {detail}")]
    AuthorityUnavailable { detail: String },
    #[error("token {token} was superseded by {current} while it waited for its turn")]
    Superseded { token: u64, current: u64 },
    #[error("earlier writes of the key were still in flight after {after:?}")]
    GateTimeout { after: Duration },
    #[error("the forward outlasted its key's turn and was cut")]
    TurnLapsed,
    #[error("the fence store did not answer within {after:?}")]
    StoreTimeout { after: Duration },
    #[error("{source}")]
    StoreFailed {
        #[source]
        source: StoreError,
    },
    #[error("upstream {}: {source}", if *.connect { "refused the connection" } else { "failed" })]
    UpstreamUnavailable {
        connect: bool,
        #[source]
        source: crate::body::BoxError,
    },
    #[error("upstream {upstream}: {reason}")]
    UpstreamTls { upstream: String, reason: String },
    #[error("upstream {upstream}: no credentials: {reason}")]
    UpstreamCredentials {
        upstream: String,
        reason: crate::upstream_auth::GrantError,
    },
    #[error("the upstream did not answer within {after:?}")]
    UpstreamTimeout { after: Duration },
    #[error("the request body is malformed or was cut off")]
    ClientBody,
    #[error("the request body paused for longer than {after:?}")]
    BodyTimeout { after: Duration },
    #[error("no connection to the upstream was free within {after:?}")]
    UpstreamBusy { after: Duration },
    #[error("the gateway's memory for buffered bodies stayed full for {after:?}")]
    MemoryBusy { after: Duration },
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the request needs an idempotency key in {place}")]
    IdempotencyKeyRequired { place: String },
    #[error("the idempotency key is {length} characters long; the provider takes at most {max}")]
    IdempotencyKeyTooLong { length: usize, max: usize },
    #[error("idempotency key {key} was used for a different request")]
    IdempotencyKeyReused { key: String },
    #[error("a request with idempotency key {key} is still in progress")]
    RequestInProgress { key: String, retry_after_secs: u64 },
    #[error("an earlier request with idempotency key {key} has an unknown outcome; the route holds it until an operator resolves it (`fencegate intents resolve`)")]
    OutcomeUnknown { key: String },
    #[error("the upstream's response body failed")]
    UpstreamBodyFailed,
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl GatewayError {
    /// Which row of the table this failure is.
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            GatewayError::NoRoute { .. } => K::NoRoute,
            GatewayError::ReservedNotFound { .. } => K::NoEndpoint,
            GatewayError::MethodNotAllowed { .. } => K::MethodNotAllowed,
            // A path segment that is not of its declared type is a key input the route refuses.
            GatewayError::InvalidPath(PathRefusal::NotOfType { .. }) => K::InvalidResourceKey,
            GatewayError::InvalidPath(_) => K::InvalidPath,
            GatewayError::InvalidMethod(_) => K::InvalidMethod,
            GatewayError::InvalidHost(_) => K::InvalidHost,
            GatewayError::Destination(DestinationRefusal::Fenced { .. }) => K::FencedDestination,
            GatewayError::Destination(_) => K::InvalidDestination,
            GatewayError::FencedCollection { .. } => K::FencedCollection,
            GatewayError::AmbiguousFraming => K::AmbiguousFraming,
            GatewayError::BadClaimKey
            | GatewayError::NoResourceKey
            | GatewayError::KeyUnavailable { .. } => K::InvalidResourceKey,
            GatewayError::Token {
                error: TokenError::Missing,
                ..
            } => K::MissingFence,
            GatewayError::Token { .. } => K::InvalidFence,
            GatewayError::Signature {
                error: SignatureError::Missing,
                ..
            } => K::MissingFenceSignature,
            GatewayError::Signature { .. } => K::InvalidFenceSignature,
            GatewayError::TooFarAhead { .. } => K::FenceTooFarAhead,
            GatewayError::StaleFence { .. } | GatewayError::Superseded { .. } => K::StaleFence,
            GatewayError::LeaseEnded { .. } => K::LeaseEnded,
            GatewayError::AuthorityUnavailable { .. } => K::AuthorityUnavailable,
            GatewayError::GateTimeout { .. } => K::GateTimeout,
            GatewayError::TurnLapsed => K::TurnLapsed,
            GatewayError::StoreFailed {
                source: StoreError::Untrusted { .. },
                ..
            } => K::StoreUntrusted,
            GatewayError::StoreFailed { .. } => K::StoreUnavailable,
            GatewayError::StoreTimeout { .. } => K::StoreTimeout,
            GatewayError::UpstreamUnavailable { .. } => K::UpstreamUnavailable,
            GatewayError::UpstreamTls { .. } => K::UpstreamTls,
            GatewayError::UpstreamCredentials { .. } => K::UpstreamCredentials,
            GatewayError::UpstreamBodyFailed => K::UpstreamResponseFailed,
            GatewayError::UpstreamTimeout { .. } => K::UpstreamTimeout,
            GatewayError::ClientBody => K::InvalidRequestBody,
            GatewayError::BodyTimeout { .. } => K::BodyTimeout,
            GatewayError::UpstreamBusy { .. } => K::UpstreamBusy,
            GatewayError::MemoryBusy { .. } => K::MemoryBusy,
            GatewayError::BodyTooLarge { .. } => K::BodyTooLarge,
            GatewayError::IdempotencyKeyRequired { .. } => K::IdempotencyKeyRequired,
            GatewayError::IdempotencyKeyTooLong { .. } => K::IdempotencyKeyTooLong,
            GatewayError::IdempotencyKeyReused { .. } => K::IdempotencyKeyReused,
            GatewayError::RequestInProgress { .. } => K::RequestInProgress,
            GatewayError::OutcomeUnknown { .. } => K::OutcomeUnknown,
            GatewayError::Internal(_) => K::Internal,
        }
    }

    pub fn origin(&self) -> Origin {
        self.kind().spec().origin
    }

    /// This failure on `route`: the context every answer and log line carries.
    pub fn on_route(self, route: impl Into<String>) -> RequestError {
        RequestError::from(self).on_route(route)
    }

    /// This failure of a request for resource key `key`, attached where the key is known.
    pub fn for_key(self, key: impl Into<String>) -> RequestError {
        RequestError {
            error: self,
            route: None,
            key: Some(key.into()),
        }
    }

    /// Whether the request certainly never reached the upstream, or reached it only to be
    /// refused unread: the connection was refused or its TLS handshake failed, no credentials
    /// for it were obtained (or the upstream refused them), no connection was free, or the key's
    /// turn never came. Anything else after forwarding began may have had an effect.
    pub fn never_reached_upstream(&self) -> bool {
        matches!(
            self,
            GatewayError::UpstreamUnavailable { connect: true, .. }
                | GatewayError::UpstreamTls { .. }
                | GatewayError::UpstreamCredentials { .. }
                | GatewayError::UpstreamBusy { .. }
                | GatewayError::GateTimeout { .. }
        )
    }

    /// What the client reads in `detail`: the message, except where it would say more than a
    /// client should know.
    fn detail(&self) -> String {
        match self {
            // Internal details never reach the client.
            GatewayError::Internal(_) => "the gateway failed to handle the request".to_owned(),
            GatewayError::StoreFailed {
                source: StoreError::Untrusted { reason },
            } => format!(
                "{reason}; fenced requests are refused until an operator runs `fencegate store adopt`"
            ),
            GatewayError::StoreFailed { .. } => {
                "the fence store failed; the request was not forwarded".to_owned()
            }
            // The token endpoint's refusal (its OAuth2 error code) is the operator's to fix and
            // safe to show; how it failed otherwise (addresses, TLS) stays in the log.
            GatewayError::UpstreamCredentials {
                reason:
                    reason @ (crate::upstream_auth::GrantError::Refused { .. }
                    | crate::upstream_auth::GrantError::RefusedByUpstream),
                ..
            } => format!("no credentials for the upstream: {reason}"),
            GatewayError::UpstreamCredentials { .. } => {
                "the gateway could not obtain credentials for the upstream".to_owned()
            }
            GatewayError::UpstreamUnavailable { connect, .. } => format!(
                "the upstream {}",
                if *connect {
                    "refused the connection"
                } else {
                    "closed the connection or failed"
                }
            ),
            other => other.to_string(),
        }
    }

    /// What the answer and the log line say besides the kind and detail: the tokens, the mark,
    /// how long to wait, what is allowed.
    #[inline]
    fn facts(&self) -> Facts {
        let mut facts = Facts::default();
        match self {
            GatewayError::TooFarAhead {
                token,
                current,
                max_advance,
            } => {
                facts.fence = Some(*token);
                facts.current_fence = Some(*current);
                facts.max_advance = Some(*max_advance);
                facts.fence_header = true;
            }
            GatewayError::StaleFence { token, current }
            | GatewayError::Superseded { token, current } => {
                facts.fence = Some(*token);
                facts.current_fence = Some(*current);
                facts.fence_header = true;
            }
            GatewayError::LeaseEnded { token, holder } => {
                facts.fence = Some(*token);
                facts.current_fence = *holder;
            }
            GatewayError::MethodNotAllowed { allow } => facts.allow = Some(allow),
            GatewayError::RequestInProgress {
                retry_after_secs, ..
            } => facts.retry_after_secs = Some(*retry_after_secs),
            _ => {}
        }
        facts
    }

    /// The one place a failure without a route becomes an HTTP answer (see
    /// [`RequestError::into_response`]).
    pub fn into_response(self, request_id: &RequestId) -> Response<ProxyBody> {
        RequestError::from(self).into_response(request_id)
    }
}

/// The one error value: what failed (a [`GatewayError`], whose kind is a row of the table) and
/// the context it failed in, each part attached once by the code that knows it: the resource key
/// where the key's token, mark, turn or store step failed, the route by routing.
#[derive(Debug)]
pub struct RequestError {
    pub error: GatewayError,
    pub route: Option<String>,
    /// The resource key (or intent record key) the failure concerns.
    pub key: Option<String>,
}

impl From<GatewayError> for RequestError {
    fn from(error: GatewayError) -> RequestError {
        RequestError {
            error,
            route: None,
            key: None,
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(route) = &self.route {
            write!(f, "route {route}: ")?;
        }
        if let Some(key) = &self.key {
            write!(f, "key {key}: ")?;
        }
        write!(f, "{}", self.error)
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl RequestError {
    /// The failure on `route` (a route attached earlier stays).
    pub fn on_route(mut self, route: impl Into<String>) -> RequestError {
        if self.route.is_none() {
            self.route = Some(route.into());
        }
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.error.kind()
    }

    pub fn origin(&self) -> Origin {
        self.error.origin()
    }

    /// See [`GatewayError::never_reached_upstream`].
    pub fn never_reached_upstream(&self) -> bool {
        self.error.never_reached_upstream()
    }

    /// The detail as the answer gives it: `route {route}: key {key}: ` before the failure's own
    /// detail, for the parts it has. A stale token's is written by hand, without the formatting
    /// machinery: it is the refusal a flood of superseded holders makes common (a unit test
    /// holds it to the `Display` text).
    fn detail(&self) -> String {
        let route = self.route.as_deref();
        let key = self.key.as_deref();
        let context = route.map_or(0, |r| "route : ".len() + r.len())
            + key.map_or(0, |k| "key : ".len() + k.len());
        let mut detail = String::with_capacity(context + 64);
        if let Some(route) = route {
            detail.push_str("route ");
            detail.push_str(route);
            detail.push_str(": ");
        }
        if let Some(key) = key {
            detail.push_str("key ");
            detail.push_str(key);
            detail.push_str(": ");
        }
        match &self.error {
            GatewayError::StaleFence { token, current } => {
                detail.push_str("token ");
                detail.push_str(itoa::Buffer::new().format(*token));
                detail.push_str(" is below the high-water mark ");
                detail.push_str(itoa::Buffer::new().format(*current));
            }
            other => detail.push_str(&other.detail()),
        }
        detail
    }

    /// The one place a failure becomes an HTTP answer, logged once with the request's id.
    pub fn into_response(self, request_id: &RequestId) -> Response<ProxyBody> {
        self.log(request_id);
        let (problem, extra) = self.answer();
        let mut response = problem.into_response();
        if let Some((name, value)) = extra {
            response.headers_mut().insert(name, value);
        }
        response
    }

    /// The answer without its body type: the problem document and the one header it adds, if
    /// any (`Retry-After`, `X-Fence-Current` or `Allow`), through [`answer`] as every failure's.
    pub fn answer(self) -> (Problem, Option<(HeaderName, HeaderValue)>) {
        let detail = self.detail();
        let RequestError { error, route, key } = self;
        let facts = Facts {
            route,
            key,
            ..error.facts()
        };
        answer(error.kind(), detail, facts)
    }

    fn log(&self, request_id: &RequestId) {
        let route = self.route.as_deref().unwrap_or("");
        let key = self.key.as_deref().unwrap_or("");
        match &self.error {
            GatewayError::StaleFence { token, current }
            | GatewayError::Superseded { token, current } => tracing::info!(
                %route,
                %key,
                token,
                current,
                %request_id,
                "refused: stale fencing token"
            ),
            GatewayError::LeaseEnded { token, holder } => tracing::info!(
                %route,
                %key,
                token,
                holder,
                %request_id,
                "refused: the token's lease ended"
            ),
            GatewayError::Token { error } => {
                tracing::info!(%route, %key, reason = %error, %request_id, "refused: fencing token")
            }
            GatewayError::Signature { error } => {
                tracing::info!(%route, %key, reason = %error, %request_id, "refused: fencing token signature")
            }
            GatewayError::TooFarAhead {
                token,
                current,
                max_advance,
            } => tracing::info!(
                %route,
                %key,
                token,
                current,
                max_advance,
                %request_id,
                "refused: fencing token too far ahead"
            ),
            other => match other.kind().spec().level {
                Level::Debug => tracing::debug!(error = %self, %request_id, "refused"),
                Level::Info => tracing::info!(error = %self, %request_id, "refused"),
                Level::Warn => tracing::warn!(error = %self, %request_id, "request failed"),
                Level::Error => tracing::error!(error = %self, %request_id, "internal error"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    /// The stale refusal's hand-written detail is the `Display` text, with and without a route,
    /// for keys that need JSON escapes and for the largest tokens.
    #[test]
    fn a_stale_tokens_detail_is_its_display_text() {
        for (key, token, current) in [
            ("invoice:1", 1, 1000),
            ("a \"quoted\" key\n", 0, u64::MAX),
            ("", u64::MAX - 1, u64::MAX),
        ] {
            let bare = RequestError::from(GatewayError::StaleFence { token, current });
            assert_eq!(bare.detail(), bare.to_string());
            let error = GatewayError::StaleFence { token, current }.for_key(key);
            assert_eq!(error.detail(), error.to_string());
            let error = error.on_route("invoices");
            assert_eq!(error.detail(), error.to_string());
            assert!(error.detail().starts_with("route invoices: key "));
        }
    }

    use super::*;

    #[test]
    fn the_table_keeps_statuses_and_slugs_and_logs_client_errors_quietly() {
        let kinds = [
            ErrorKind::NoRoute,
            ErrorKind::StaleFence,
            ErrorKind::StoreUntrusted,
            ErrorKind::UpstreamBusy,
            ErrorKind::Internal,
            ErrorKind::Unauthorized,
        ];
        for kind in kinds {
            let spec = kind.spec();
            assert!(!spec.slug.is_empty() && !spec.title.is_empty(), "{kind:?}");
            if spec.origin == Origin::Client {
                assert!(matches!(spec.level, Level::Debug | Level::Info), "{kind:?}");
            }
        }
        assert_eq!(ErrorKind::StaleFence.spec().status, 409);
        assert_eq!(ErrorKind::StoreUntrusted.spec().slug, "store-untrusted");
    }
}
