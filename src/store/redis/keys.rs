//! The names of the backend's own keys under the configured prefix: a key's mark and the
//! store's identity.

pub(super) fn mark_key(prefix: &str, key: &str) -> String {
    format!("{prefix}mark:{key}")
}

pub(super) fn store_id_key(prefix: &str) -> String {
    format!("{prefix}store-id")
}
