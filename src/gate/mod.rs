//! Serialized generations (I4): at most one forwarded write per resource key in flight to the
//! upstream, in admission order. `local.rs` orders one process; `postgres.rs` extends the order
//! across replicas sharing a PostgreSQL store; `layer.rs` puts the gate on the request path and
//! `body.rs` holds it until the upstream's response has been streamed.

mod body;
mod holders;
mod layer;
mod local;
mod lock_holder;
mod postgres;

pub use body::GatedBody;
pub use layer::{Gate, GateLayer};
pub use local::{Busy, LocalGate, LocalPass};
pub use postgres::{DedicatedLock, PostgresGate, SharedGateError, SharedPass};

use std::sync::Arc;

use crate::config::StoreConfig;
use crate::store::StoreError;

/// The gates of one gateway: always the in-process one, plus the cross-replica one where the
/// store can provide it.
#[derive(Clone)]
pub struct Gates {
    pub local: Arc<LocalGate>,
    pub shared: Option<Arc<PostgresGate>>,
}

impl Gates {
    /// Opens the gates the store configuration allows: PostgreSQL gets a cross-replica gate;
    /// the embedded store is single-node; Redis offers none that stays sound when a holder pauses
    /// (see the README), so only the in-process order holds there.
    pub async fn open(config: &StoreConfig) -> Result<Gates, StoreError> {
        let shared = match config {
            StoreConfig::Postgres(postgres) => Some(Arc::new(PostgresGate::open(postgres).await?)),
            StoreConfig::Embedded(_) | StoreConfig::Redis(_) => None,
        };
        Ok(Gates {
            local: Arc::new(LocalGate::default()),
            shared,
        })
    }

    /// Only the in-process gate.
    pub fn local_only() -> Gates {
        Gates {
            local: Arc::new(LocalGate::default()),
            shared: None,
        }
    }
}
