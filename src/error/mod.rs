//! Every way a request can fail inside the gateway. A failure is a [`GatewayError`] (what went
//! wrong, with the key and figures it concerns); its [`ErrorKind`] looks up everything else in
//! one table (`kind.rs`); the route is attached once, by routing, as a [`RequestError`], which is
//! what turns into the problem response and the log line — in exactly one place.

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
    #[error("key {key}: {error}")]
    Token { key: String, error: TokenError },
    #[error("key {key}: {error}")]
    Signature { key: String, error: SignatureError },
    #[error(
        "key {key}: token {token} is more than {max_advance} above the high-water mark {current}"
    )]
    TooFarAhead {
        key: String,
        token: u64,
        current: u64,
        max_advance: u64,
    },
    #[error("key {key}: token {token} is below the high-water mark {current}")]
    StaleFence {
        key: String,
        token: u64,
        current: u64,
    },
    #[error("key {key}: token {token} is not the lock's current holder ({}): its lease ended", holder.map_or_else(|| "no one holds it".to_owned(), |h| format!("held with token {h}")))]
    LeaseEnded {
        key: String,
        token: u64,
        holder: Option<u64>,
    },
    #[error("key {key}: the lock authority cannot be consulted: {detail}")]
    AuthorityUnavailable { key: String, detail: String },
    #[error("key {key}: token {token} was superseded by {current} while it waited for its turn")]
    Superseded {
        key: String,
        token: u64,
        current: u64,
    },
    #[error("key {key}: earlier writes of the key were still in flight after {after:?}")]
    GateTimeout { key: String, after: Duration },
    #[error("key {key}: the forward outlasted its key's turn and was cut")]
    TurnLapsed { key: String },
    #[error("key {key}: the fence store did not answer within {after:?}")]
    StoreTimeout { key: String, after: Duration },
    #[error("key {key}: {source}")]
    StoreFailed {
        key: String,
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
            GatewayError::TurnLapsed { .. } => K::TurnLapsed,
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
        RequestError {
            error: self,
            route: Some(route.into()),
        }
    }

    /// The resource key the failure concerns, when it concerns one.
    fn key(&self) -> Option<&str> {
        match self {
            GatewayError::Token { key, .. }
            | GatewayError::Signature { key, .. }
            | GatewayError::TooFarAhead { key, .. }
            | GatewayError::StaleFence { key, .. }
            | GatewayError::Superseded { key, .. }
            | GatewayError::LeaseEnded { key, .. }
            | GatewayError::AuthorityUnavailable { key, .. }
            | GatewayError::GateTimeout { key, .. }
            | GatewayError::TurnLapsed { key }
            | GatewayError::StoreTimeout { key, .. }
            | GatewayError::StoreFailed { key, .. } => Some(key),
            _ => None,
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
                key,
                source: StoreError::Untrusted { reason },
            } => format!(
                "key {key}: {reason}; fenced requests are refused until an operator runs `fencegate store adopt`"
            ),
            GatewayError::StoreFailed { key, .. } => {
                format!("key {key}: the fence store failed; the request was not forwarded")
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

    /// The detail as the answer gives it, after `route {route}: ` when the failure has a route.
    /// A stale token's is written by hand, without the formatting machinery: it is the refusal
    /// a flood of superseded holders makes common (a unit test holds it to the `Display` text).
    fn detail_on(&self, route: Option<&str>) -> String {
        let GatewayError::StaleFence {
            key,
            token,
            current,
        } = self
        else {
            return match route {
                Some(route) => format!("route {route}: {}", self.detail()),
                None => self.detail(),
            };
        };
        let mut token_digits = itoa::Buffer::new();
        let mut current_digits = itoa::Buffer::new();
        let parts = [
            key.as_str(),
            ": token ",
            token_digits.format(*token),
            " is below the high-water mark ",
            current_digits.format(*current),
        ];
        let prefix = route.map_or(0, |route| "route ".len() + route.len() + ": ".len());
        let mut detail = String::with_capacity(
            prefix + "key ".len() + parts.iter().map(|part| part.len()).sum::<usize>(),
        );
        if let Some(route) = route {
            detail.push_str("route ");
            detail.push_str(route);
            detail.push_str(": ");
        }
        detail.push_str("key ");
        parts.iter().for_each(|part| detail.push_str(part));
        detail
    }

    /// The one place a failure without a route becomes an HTTP answer (see
    /// [`RequestError::into_response`]).
    pub fn into_response(self, request_id: &RequestId) -> Response<ProxyBody> {
        RequestError::from(self).into_response(request_id)
    }
}

/// A failure with the route it happened on, if it got that far.
#[derive(Debug)]
pub struct RequestError {
    pub error: GatewayError,
    pub route: Option<String>,
}

impl From<GatewayError> for RequestError {
    fn from(error: GatewayError) -> RequestError {
        RequestError { error, route: None }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.route {
            Some(route) => write!(f, "route {route}: {}", self.error),
            None => write!(f, "{}", self.error),
        }
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl RequestError {
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
        let RequestError { error, route } = self;
        let detail = error.detail_on(route.as_deref());
        let mut facts = Facts {
            key: error.key().map(str::to_owned),
            route,
            ..Facts::default()
        };
        match &error {
            GatewayError::TooFarAhead {
                token,
                current,
                max_advance,
                ..
            } => {
                facts.fence = Some(*token);
                facts.current_fence = Some(*current);
                facts.max_advance = Some(*max_advance);
                facts.fence_header = true;
            }
            GatewayError::StaleFence { token, current, .. }
            | GatewayError::Superseded { token, current, .. } => {
                facts.fence = Some(*token);
                facts.current_fence = Some(*current);
                facts.fence_header = true;
            }
            GatewayError::LeaseEnded { token, holder, .. } => {
                facts.fence = Some(*token);
                facts.current_fence = *holder;
            }
            GatewayError::MethodNotAllowed { allow } => facts.allow = Some(allow),
            GatewayError::RequestInProgress {
                retry_after_secs, ..
            } => facts.retry_after_secs = Some(*retry_after_secs),
            _ => {}
        }
        answer(error.kind(), detail, facts)
    }

    fn log(&self, request_id: &RequestId) {
        let route = self.route.as_deref().unwrap_or("");
        match &self.error {
            GatewayError::StaleFence {
                key,
                token,
                current,
            }
            | GatewayError::Superseded {
                key,
                token,
                current,
            } => tracing::info!(
                %route,
                %key,
                token,
                current,
                %request_id,
                "refused: stale fencing token"
            ),
            GatewayError::LeaseEnded { key, token, holder } => tracing::info!(
                %route,
                %key,
                token,
                holder,
                %request_id,
                "refused: the token's lease ended"
            ),
            GatewayError::Token { key, error } => {
                tracing::info!(%route, %key, reason = %error, %request_id, "refused: fencing token")
            }
            GatewayError::Signature { key, error } => {
                tracing::info!(%route, %key, reason = %error, %request_id, "refused: fencing token signature")
            }
            GatewayError::TooFarAhead {
                key,
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
            let error = GatewayError::StaleFence {
                key: key.to_owned(),
                token,
                current,
            };
            assert_eq!(error.detail_on(None), error.to_string());
            assert_eq!(
                error.detail_on(Some("invoices")),
                format!("route invoices: {error}")
            );
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
