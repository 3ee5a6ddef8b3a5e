//! The etcd backend's name in logs and metrics, and its errors as store errors.

use std::sync::Arc;

use crate::etcd::client::EtcdError;
use crate::store::StoreError;

pub(super) const BACKEND: &str = "etcd";

pub(super) fn wrap(error: EtcdError) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::new(error),
    }
}

/// An answer that does not have the shape its request asks for.
pub(super) fn unexpected(detail: impl Into<String>) -> StoreError {
    wrap(EtcdError::Protocol(detail.into()))
}
