//! Whether the gateway has been asked to stop: set on SIGTERM before the drain begins, so that
//! `/readyz` sends load balancers elsewhere while the listener still serves for `drain_delay`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared flag, cheap to clone: unset while the gateway serves, set once it is asked to stop.
#[derive(Debug, Clone, Default)]
pub struct Stopping(Arc<AtomicBool>);

impl Stopping {
    /// From now on `/readyz` answers 503.
    pub fn begin(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_stopping(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
