//! The backend's name, and Redis errors as the store's errors.

use std::sync::Arc;

use redis::RedisError;

use crate::store::StoreError;

/// The backend's name in errors, logs and metrics.
pub(super) const BACKEND: &str = "redis";

pub(super) fn wrap(source: RedisError) -> StoreError {
    backend_error(&Arc::new(source))
}

pub(super) fn backend_error(source: &Arc<RedisError>) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::clone(source) as Arc<dyn std::error::Error + Send + Sync>,
    }
}
