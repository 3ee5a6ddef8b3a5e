//! The store identity this gateway adopted, shared by a backend's writers so that every advance
//! and every turn taken compares it in its own atomic step: a store wiped or replaced while the
//! gateway runs refuses the very first write that would trust it (docs/design.md §4.4).

use std::sync::{Arc, PoisonError, RwLock};

#[derive(Debug, Default)]
pub struct ExpectedIdentity {
    id: RwLock<Option<Arc<str>>>,
}

impl ExpectedIdentity {
    /// The adopted store's id, once the adoption check has run (`None` before: nothing compared).
    pub fn get(&self) -> Option<Arc<str>> {
        self.id
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records the adopted store's id (at start, and after an operator adopts a store).
    pub fn set(&self, id: &str) {
        let mut current = self.id.write().unwrap_or_else(PoisonError::into_inner);
        if current.as_deref() != Some(id) {
            *current = Some(id.into());
        }
    }
}

/// The reason a store whose identity record is not the adopted one gives for refusing a write.
pub fn mismatch_reason(expected: &str, found: Option<&str>) -> String {
    format!(
        "the store's identity record is {}, not the store {expected} this gateway adopted (it was wiped or replaced); refusing writes until an operator runs `fencegate store adopt`",
        found.unwrap_or("missing")
    )
}
