//! How an admin call fails: every failure is a problem document (application/problem+json)
//! from the same table of kinds ([`ErrorKind`]) as the data plane's refusals.

use std::time::Duration;

use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::{ErrorKind, Level};
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
        let mut problem = kind.problem(self.to_string());
        match &self {
            AdminError::NoMark { key }
            | AdminError::NoIntent { key }
            | AdminError::IntentNotSubmitting { key, .. } => problem.key = Some(key.clone()),
            AdminError::MarkNotLowered { key, current } => {
                problem.key = Some(key.clone());
                problem.current_fence = Some(*current);
            }
            _ => {}
        }
        let mut response = problem.into_response().map(axum::body::Body::new);
        if let AdminError::Unauthorized = self {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
