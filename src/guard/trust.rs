//! Whether the gateway trusts its store. A store that lost its data would reset every mark and
//! re-admit zombies, so once the gateway has reason to think so it refuses fenced traffic until an
//! operator adopts the store (`fencegate store adopt`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::store::StoreError;

#[derive(Debug, Default)]
pub struct StoreTrust {
    /// Fast path: read on every fenced request.
    distrusted: AtomicBool,
    /// Why, and which adoption was in force then (a newer adoption restores trust).
    reason: Mutex<Option<(String, String)>>,
    /// The adoption in force, as last seen by the store check.
    adoption: Mutex<String>,
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
        let adoption = self.adoption.lock().map(|a| a.clone()).unwrap_or_default();
        if let Ok(mut current) = self.reason.lock() {
            if current.is_none() {
                tracing::error!(%reason, "refusing fenced traffic until an operator runs `fencegate store adopt`");
                *current = Some((reason, adoption));
            }
        }
        self.distrusted.store(true, Ordering::Release);
    }

    /// Records the adoption in force (read from the gateway's adoption record).
    pub fn note_adoption(&self, adoption_id: &str) {
        if let Ok(mut current) = self.adoption.lock() {
            adoption_id.clone_into(&mut current);
        }
    }

    /// Whether `adoption_id` is a newer adoption than the one in force when trust was lost.
    pub fn adopted_since_distrust(&self, adoption_id: &str) -> bool {
        self.reason
            .lock()
            .ok()
            .and_then(|reason| reason.as_ref().map(|(_, under)| under != adoption_id))
            .unwrap_or(false)
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
