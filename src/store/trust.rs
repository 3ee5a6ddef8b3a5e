//! Whether the gateway trusts its store. A store that lost its data would reset every mark and
//! re-admit zombies, so once the gateway has reason to think so it refuses fenced traffic until an
//! operator adopts the store (`fencegate store adopt`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use super::StoreError;

#[derive(Debug, Default)]
pub struct StoreTrust {
    /// Fast path: read on every fenced request.
    distrusted: AtomicBool,
    /// Why, and since when (a later adoption restores trust).
    reason: Mutex<Option<(String, SystemTime)>>,
}

impl StoreTrust {
    /// `Err` while the store is not trusted.
    pub fn check(&self) -> Result<(), StoreError> {
        if !self.distrusted.load(Ordering::Acquire) {
            return Ok(());
        }
        let reason = self
            .reason
            .lock()
            .map(|r| r.as_ref().map(|(reason, _)| reason.clone()))
            .unwrap_or_default()
            .unwrap_or_else(|| "the store is not trusted".to_owned());
        Err(StoreError::Untrusted { reason })
    }

    pub fn is_trusted(&self) -> bool {
        !self.distrusted.load(Ordering::Acquire)
    }

    /// Stops trusting the store; the first reason is kept.
    pub fn distrust(&self, reason: String) {
        if let Ok(mut current) = self.reason.lock() {
            if current.is_none() {
                tracing::error!(%reason, "refusing fenced traffic until an operator runs `fencegate store adopt`");
                *current = Some((reason, SystemTime::now()));
            }
        }
        self.distrusted.store(true, Ordering::Release);
    }

    /// Since when the store is distrusted.
    pub fn distrusted_since(&self) -> Option<SystemTime> {
        self.reason.lock().ok()?.as_ref().map(|(_, since)| *since)
    }

    /// Trusts the store again (after an adoption newer than the distrust).
    pub fn restore(&self) {
        if let Ok(mut current) = self.reason.lock() {
            *current = None;
        }
        self.distrusted.store(false, Ordering::Release);
        tracing::info!("store adopted: serving fenced traffic again");
    }
}
