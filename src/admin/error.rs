//! How an admin call fails: every failure is a problem document (application/problem+json)
//! from the same table of kinds ([`ErrorKind`]) as the data plane's refusals, answered by the
//! same function (`error::answer`), `Retry-After` included.

use std::time::Duration;

use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::{answer, ErrorKind, Facts, Level};
use crate::store::StoreError;

/// Every way an admin call fails.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("key {key}: no mark for this key")]
    NoMark { key: String },
    #[error("key {key}: the mark is {current}; marks never go down")]
    MarkNotLowered { key: String, current: u64 },
    #[error("{0}")]
    InvalidQuery(String),
    #[error("{0}")]
    InvalidBody(String),
    #[error("{0}")]
    InvalidKey(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("intent {key}: no such intent")]
    NoIntent { key: String },
    #[error("intent {key}: its outcome is already recorded (state {state}); only a SUBMITTING intent is resolved")]
    IntentNotSubmitting { key: String, state: &'static str },
    #[error("no admin endpoint {0}")]
    NoSuchEndpoint(String),
    #[error("{0} is not allowed on this endpoint")]
    MethodNotAllowed(String),
    #[error("the store did not answer within {0:?}")]
    StoreTimeout(Duration),
    #[error(transparent)]
    Store(StoreError),
}

impl AdminError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            AdminError::Unauthorized => ErrorKind::Unauthorized,
            AdminError::NoMark { .. } => ErrorKind::NoMark,
            AdminError::MarkNotLowered { .. } => ErrorKind::MarkNotLowered,
            AdminError::InvalidQuery(_) => ErrorKind::InvalidQuery,
            AdminError::InvalidBody(_) => ErrorKind::InvalidBody,
            AdminError::InvalidKey(_) => ErrorKind::InvalidKey,
            AdminError::InvalidConfig(_) => ErrorKind::InvalidConfig,
            AdminError::NoIntent { .. } => ErrorKind::NoIntent,
            AdminError::IntentNotSubmitting { .. } => ErrorKind::IntentNotSubmitting,
            AdminError::NoSuchEndpoint(_) => ErrorKind::NoSuchEndpoint,
            AdminError::MethodNotAllowed(_) => ErrorKind::MethodNotAllowed,
            AdminError::StoreTimeout(_) => ErrorKind::StoreTimeout,
            AdminError::Store(StoreError::Untrusted { .. }) => ErrorKind::StoreUntrusted,
            AdminError::Store(_) => ErrorKind::StoreUnavailable,
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let kind = self.kind();
        if matches!(kind.spec().level, Level::Warn | Level::Error) {
            tracing::warn!(error = %self, "admin call failed");
        }
        let mut facts = Facts::default();
        match &self {
            AdminError::NoMark { key }
            | AdminError::NoIntent { key }
            | AdminError::IntentNotSubmitting { key, .. } => facts.key = Some(key.clone()),
            AdminError::MarkNotLowered { key, current } => {
                facts.key = Some(key.clone());
                facts.current_fence = Some(*current);
            }
            _ => {}
        }
        let (problem, extra) = answer(kind, self.to_string(), facts);
        let mut response = problem.into_response().map(axum::body::Body::new);
        if let Some((name, value)) = extra {
            response.headers_mut().insert(name, value);
        }
        if let AdminError::Unauthorized = self {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::header;
    use axum::response::IntoResponse;

    use super::AdminError;
    use crate::error::GatewayError;
    use crate::store::StoreError;

    /// A store that fails an admin call is answered as it is on the data plane: same status,
    /// same type, and the table's `Retry-After`.
    #[test]
    fn a_store_failure_is_answered_as_the_data_plane_answers_it() {
        let after = Duration::from_secs(2);
        let cases = [
            (
                AdminError::StoreTimeout(after),
                GatewayError::StoreTimeout { after },
            ),
            (
                AdminError::Store(StoreError::Closed),
                GatewayError::StoreFailed {
                    source: StoreError::Closed,
                },
            ),
        ];
        for (admin, data) in cases {
            let name = admin.to_string();
            let admin = admin.into_response();
            let (problem, header) = data.for_key("k").answer();
            assert_eq!(admin.status().as_u16(), problem.status, "{name}");
            let retry = header.filter(|(name, _)| name == header::RETRY_AFTER);
            let expected = retry.map(|(_, value)| value);
            assert!(
                expected.is_some(),
                "{name}: the data plane says when to retry"
            );
            assert_eq!(
                admin.headers().get(header::RETRY_AFTER),
                expected.as_ref(),
                "{name}"
            );
        }
    }
}
