//! Every way a request can fail inside the gateway, where it came from, and — in exactly one
//! place, `GatewayError::into_response` — the problem response and log line it turns into.

use std::time::Duration;

use http::{header, HeaderName, HeaderValue, Response, StatusCode};

use crate::fence::{SignatureError, TokenError};
use crate::gateway::{DestinationRefusal, HostRefusal};
use crate::problem::Problem;
use crate::proxy::ProxyBody;
use crate::request_id::RequestId;
use crate::route::{MethodRefusal, PathRefusal, RenderError};
use crate::store::StoreError;

/// Header naming the key's high-water mark on a stale-fence refusal.
pub const X_FENCE_CURRENT: HeaderName = HeaderName::from_static("x-fence-current");
/// Seconds a client should wait before retrying after the store failed.
const STORE_RETRY_AFTER_SECS: &str = "1";

/// Who caused a failure: decides the log level and whether a retry may help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Client,
    Store,
    Upstream,
    Gateway,
}

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
    #[error("the path may name a collection holding resources of fenced route {route}; write them there with their own tokens instead")]
    FencedCollection { route: String },
    #[error("the claim path names no valid resource key")]
    BadClaimKey,
    #[error(
        "the request carries both Content-Length and Transfer-Encoding; its framing is ambiguous"
    )]
    AmbiguousFraming,
    #[error("route {route}: {error}")]
    KeyUnavailable { route: String, error: RenderError },
    #[error("route {route}: key {key}: {error}")]
    Token {
        route: String,
        key: String,
        error: TokenError,
    },
    #[error("route {route}: key {key}: {error}")]
    Signature {
        route: String,
        key: String,
        error: SignatureError,
    },
    #[error("route {route}: key {key}: token {token} is more than {max_advance} above the high-water mark {current}")]
    TooFarAhead {
        route: String,
        key: String,
        token: u64,
        current: u64,
        max_advance: u64,
    },
    #[error("route {route}: key {key}: token {token} is below the high-water mark {current}")]
    StaleFence {
        route: String,
        key: String,
        token: u64,
        current: u64,
    },
    #[error("route {route}: key {key}: token {token} was superseded by {current} while it waited for its turn")]
    Superseded {
        route: String,
        key: String,
        token: u64,
        current: u64,
    },
    #[error(
        "route {route}: key {key}: earlier writes of the key were still in flight after {after:?}"
    )]
    GateTimeout {
        route: String,
        key: String,
        after: Duration,
    },
    #[error("route {route}: key {key}: the forward outlasted its key's turn and was cut")]
    TurnLapsed { route: String, key: String },
    #[error("route {route}: key {key}: the fence store did not answer within {after:?}")]
    StoreTimeout {
        route: String,
        key: String,
        after: Duration,
    },
    #[error("route {route}: key {key}: {source}")]
    StoreFailed {
        route: String,
        key: String,
        #[source]
        source: StoreError,
    },
    #[error("route {route}: upstream {}: {source}", if *.connect { "refused the connection" } else { "failed" })]
    UpstreamUnavailable {
        route: String,
        connect: bool,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("route {route}: the upstream did not answer within {after:?}")]
    UpstreamTimeout { route: String, after: Duration },
    #[error("the request body is malformed or was cut off")]
    ClientBody,
    #[error("the request body paused for longer than {after:?}")]
    BodyTimeout { after: Duration },
    #[error("route {route}: no connection to the upstream was free within {after:?}")]
    UpstreamBusy { route: String, after: Duration },
    #[error("route {route}: the gateway's memory for buffered bodies stayed full for {after:?}")]
    MemoryBusy { route: String, after: Duration },
    #[error("route {route}: the request body is larger than {limit} bytes")]
    BodyTooLarge { route: String, limit: usize },
    #[error("route {route}: the request needs an idempotency key in the {header} header")]
    IdempotencyKeyRequired { route: String, header: String },
    #[error("route {route}: idempotency key {key} was used for a different request")]
    IdempotencyKeyReused { route: String, key: String },
    #[error("route {route}: a request with idempotency key {key} is still in progress")]
    RequestInProgress {
        route: String,
        key: String,
        retry_after_secs: u64,
    },
    #[error("route {route}: the upstream's response body failed")]
    UpstreamBodyFailed { route: String },
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl GatewayError {
    pub fn origin(&self) -> Origin {
        match self {
            GatewayError::StoreTimeout { .. } | GatewayError::StoreFailed { .. } => Origin::Store,
            GatewayError::UpstreamUnavailable { .. }
            | GatewayError::UpstreamTimeout { .. }
            | GatewayError::UpstreamBodyFailed { .. } => Origin::Upstream,
            GatewayError::Internal(_) => Origin::Gateway,
            // Shedding load (`upstream-busy`, `memory-busy`) is logged like a client's error, at
            // debug: a flood must not flood the log too. The request counters show it.
            _ => Origin::Client,
        }
    }

    fn status_slug_title(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            GatewayError::NoRoute { .. } => (StatusCode::NOT_FOUND, "no-route", "No route matches"),
            GatewayError::ReservedNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "no-route",
                "No such gateway endpoint",
            ),
            GatewayError::MethodNotAllowed { .. } => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            GatewayError::InvalidPath(_) => {
                (StatusCode::BAD_REQUEST, "invalid-path", "Invalid path")
            }
            GatewayError::InvalidMethod(_) => {
                (StatusCode::BAD_REQUEST, "invalid-method", "Invalid method")
            }
            GatewayError::InvalidHost(_) => {
                (StatusCode::BAD_REQUEST, "invalid-host", "Invalid host")
            }
            GatewayError::Destination(DestinationRefusal::Fenced { .. }) => (
                StatusCode::FORBIDDEN,
                "fenced-destination",
                "Destination on a fenced route",
            ),
            GatewayError::FencedCollection { .. } => (
                StatusCode::FORBIDDEN,
                "fenced-collection",
                "Collection holding fenced resources",
            ),
            GatewayError::Destination(_) => (
                StatusCode::BAD_REQUEST,
                "invalid-destination",
                "Invalid destination",
            ),
            GatewayError::AmbiguousFraming => (
                StatusCode::BAD_REQUEST,
                "ambiguous-framing",
                "Ambiguous message framing",
            ),
            GatewayError::BadClaimKey | GatewayError::KeyUnavailable { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid-resource-key",
                "Resource key unavailable",
            ),
            GatewayError::Token {
                error: TokenError::Missing,
                ..
            } => (
                StatusCode::PRECONDITION_REQUIRED,
                "missing-fence",
                "Fencing token required",
            ),
            GatewayError::Token { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid-fence",
                "Invalid fencing token",
            ),
            GatewayError::Signature {
                error: SignatureError::Missing,
                ..
            } => (
                StatusCode::PRECONDITION_REQUIRED,
                "missing-fence-signature",
                "Fencing token signature required",
            ),
            GatewayError::Signature { .. } => (
                StatusCode::FORBIDDEN,
                "invalid-fence-signature",
                "Invalid fencing token signature",
            ),
            GatewayError::TooFarAhead { .. } => (
                StatusCode::CONFLICT,
                "fence-too-far-ahead",
                "Fencing token too far ahead",
            ),
            GatewayError::StaleFence { .. } | GatewayError::Superseded { .. } => {
                (StatusCode::CONFLICT, "stale-fence", "Stale fencing token")
            }
            GatewayError::GateTimeout { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "gate-timeout", "Key busy")
            }
            GatewayError::TurnLapsed { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "turn-lapsed",
                "Key turn ran out",
            ),
            GatewayError::StoreFailed {
                source: StoreError::Untrusted { .. },
                ..
            } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-untrusted",
                "Fence store not trusted",
            ),
            GatewayError::StoreTimeout { .. } | GatewayError::StoreFailed { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Fence store unavailable",
            ),
            GatewayError::UpstreamUnavailable { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream-unavailable",
                "Upstream unavailable",
            ),
            GatewayError::UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timed out",
            ),
            GatewayError::ClientBody => (
                StatusCode::BAD_REQUEST,
                "invalid-request-body",
                "Request body malformed",
            ),
            GatewayError::BodyTimeout { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body too slow",
            ),
            GatewayError::UpstreamBusy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream-busy",
                "Upstream busy",
            ),
            GatewayError::MemoryBusy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "memory-busy",
                "Gateway busy",
            ),
            GatewayError::BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
            ),
            GatewayError::IdempotencyKeyRequired { .. } => (
                StatusCode::BAD_REQUEST,
                "idempotency-key-required",
                "Idempotency key required",
            ),
            GatewayError::IdempotencyKeyReused { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency key reused",
            ),
            GatewayError::RequestInProgress { .. } => (
                StatusCode::CONFLICT,
                "request-in-progress",
                "Request in progress",
            ),
            GatewayError::UpstreamBodyFailed { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream-unavailable",
                "Upstream response failed",
            ),
            GatewayError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal gateway error",
            ),
        }
    }

    /// The one place a failure becomes an HTTP answer, logged once with the request's id.
    pub fn into_response(self, request_id: &RequestId) -> Response<ProxyBody> {
        self.log(request_id);
        let (status, slug, title) = self.status_slug_title();
        let detail = match &self {
            // Internal details never reach the client.
            GatewayError::Internal(_) => "the gateway failed to handle the request".to_owned(),
            GatewayError::StoreFailed {
                route,
                key,
                source: StoreError::Untrusted { reason },
            } => format!(
                "route {route}: key {key}: {reason}; fenced requests are refused until an operator runs `fencegate store adopt`"
            ),
            GatewayError::StoreFailed { route, key, .. } => {
                format!("route {route}: key {key}: the fence store failed; the request was not forwarded")
            }
            GatewayError::UpstreamUnavailable { route, connect, .. } => format!(
                "route {route}: the upstream {}",
                if *connect {
                    "refused the connection"
                } else {
                    "closed the connection or failed"
                }
            ),
            other => other.to_string(),
        };
        let mut problem = Problem::new(status, slug, title, detail);
        let mut extra: Option<(HeaderName, HeaderValue)> = None;
        match &self {
            GatewayError::KeyUnavailable { route, .. }
            | GatewayError::UpstreamUnavailable { route, .. }
            | GatewayError::UpstreamTimeout { route, .. } => problem.route = Some(route.clone()),
            GatewayError::Token { route, key, .. } | GatewayError::Signature { route, key, .. } => {
                problem.route = Some(route.clone());
                problem.key = Some(key.clone());
            }
            GatewayError::TooFarAhead {
                route,
                key,
                token,
                current,
                max_advance,
            } => {
                problem.route = Some(route.clone());
                problem.key = Some(key.clone());
                problem.fence = Some(*token);
                problem.current_fence = Some(*current);
                problem.max_advance = Some(*max_advance);
                extra = Some((X_FENCE_CURRENT, HeaderValue::from(*current)));
            }
            GatewayError::StaleFence {
                route,
                key,
                token,
                current,
            }
            | GatewayError::Superseded {
                route,
                key,
                token,
                current,
            } => {
                problem.route = Some(route.clone());
                problem.key = Some(key.clone());
                problem.fence = Some(*token);
                problem.current_fence = Some(*current);
                extra = Some((X_FENCE_CURRENT, HeaderValue::from(*current)));
            }
            GatewayError::StoreTimeout { route, key, .. }
            | GatewayError::StoreFailed { route, key, .. }
            | GatewayError::GateTimeout { route, key, .. }
            | GatewayError::TurnLapsed { route, key } => {
                problem.route = Some(route.clone());
                problem.key = Some(key.clone());
                extra = Some((
                    header::RETRY_AFTER,
                    HeaderValue::from_static(STORE_RETRY_AFTER_SECS),
                ));
            }
            GatewayError::UpstreamBusy { route, .. } | GatewayError::MemoryBusy { route, .. } => {
                problem.route = Some(route.clone());
                extra = Some((
                    header::RETRY_AFTER,
                    HeaderValue::from_static(STORE_RETRY_AFTER_SECS),
                ));
            }
            GatewayError::RequestInProgress {
                route,
                retry_after_secs,
                ..
            } => {
                problem.route = Some(route.clone());
                extra = Some((header::RETRY_AFTER, HeaderValue::from(*retry_after_secs)));
            }
            GatewayError::IdempotencyKeyRequired { route, .. }
            | GatewayError::IdempotencyKeyReused { route, .. }
            | GatewayError::BodyTooLarge { route, .. }
            | GatewayError::UpstreamBodyFailed { route } => problem.route = Some(route.clone()),
            GatewayError::MethodNotAllowed { allow } => {
                extra = Some((header::ALLOW, HeaderValue::from_static(allow)));
            }
            _ => {}
        }
        let mut response = problem.into_response();
        if let Some((name, value)) = extra {
            response.headers_mut().insert(name, value);
        }
        response
    }

    fn log(&self, request_id: &RequestId) {
        match self {
            GatewayError::StaleFence {
                route,
                key,
                token,
                current,
            }
            | GatewayError::Superseded {
                route,
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
            GatewayError::Token { route, key, error } => {
                tracing::info!(%route, %key, reason = %error, %request_id, "refused: fencing token")
            }
            GatewayError::Signature { route, key, error } => {
                tracing::info!(%route, %key, reason = %error, %request_id, "refused: fencing token signature")
            }
            GatewayError::TooFarAhead {
                route,
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
            other => match other.origin() {
                Origin::Client => tracing::debug!(error = %other, %request_id, "refused"),
                Origin::Store | Origin::Upstream => {
                    tracing::warn!(error = %other, %request_id, "request failed")
                }
                Origin::Gateway => tracing::error!(error = %other, %request_id, "internal error"),
            },
        }
    }
}
