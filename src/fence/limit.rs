//! `max_advance`: a token more than N above its key's current mark is refused, so a client that
//! can reach the data plane cannot jump a key's mark to `u64::MAX` and lock every holder out
//! (marks never go down).
//!
//! Marks only grow, so any mark this process has seen is a lower bound of the store's: a token
//! within N of it may go on to the compare-and-advance at once. Only when that lower bound says
//! "too far" is the store asked for the key's current mark before refusing. Between this check
//! and the advance the mark can only rise, which makes the check stricter, never looser.

use std::time::Duration;

use crate::error::{GatewayError, RequestError};
use crate::guard::CheckedStore;

/// Whether `token` is within `max_advance` of `mark` (a key never advanced counts as mark 0).
///
/// ```
/// use fencegate::fence::within_max_advance;
///
/// assert!(within_max_advance(Some(10), 15, 5));
/// assert!(!within_max_advance(Some(10), 16, 5));
/// assert!(within_max_advance(None, 5, 5));
/// assert!(!within_max_advance(None, u64::MAX, 5));
/// assert!(within_max_advance(Some(u64::MAX - 1), u64::MAX, 5));
/// ```
pub fn within_max_advance(mark: Option<u64>, token: u64, max_advance: u64) -> bool {
    token <= mark.unwrap_or(0).saturating_add(max_advance)
}

/// Refuses `token` for `key` when it is more than `max_advance` above the key's mark. Store
/// failures come back as the store errors the fence already answers (and may fail open on).
pub async fn check_max_advance(
    key: &str,
    token: u64,
    max_advance: u64,
    store: &CheckedStore,
    store_timeout: Duration,
) -> Result<(), RequestError> {
    if within_max_advance(store.known_mark(key), token, max_advance) {
        return Ok(());
    }
    let current = super::store_step::store_call(key, store_timeout, store.current(key)).await?;
    if within_max_advance(current, token, max_advance) {
        return Ok(());
    }
    Err(GatewayError::TooFarAhead {
        token,
        current: current.unwrap_or(0),
        max_advance,
    }
    .for_key(key))
}
