//! Serialized generations (I4): at most one forwarded write per resource key in flight to the
//! upstream, in admission order. `local.rs` orders one process; `cross_replica.rs` extends the order
//! across replicas through key turns leased in the store; `layer.rs` puts the gate on the request
//! path, `read_ahead.rs` ends a turn once the upstream is done, and `body.rs` holds it while a
//! response too long to read ahead is streamed.

mod body;
mod cross_replica;
mod layer;
mod local;
mod read_ahead;

pub use body::GatedBody;
pub use cross_replica::{CrossReplicaGate, CrossReplicaGateError, CrossReplicaPass, TurnWatch};
pub use layer::{Gate, GateLayer};
pub use local::{Busy, LocalGate, LocalPass};

use std::sync::Arc;
use std::time::Duration;

use crate::store::TurnStore;

/// The gates of one gateway: always the in-process one, plus the cross-replica one where the
/// store keeps key turns (PostgreSQL, Redis, etcd; the embedded store is single-node).
#[derive(Clone)]
pub struct Gates {
    pub local: Arc<LocalGate>,
    pub cross_replica: Option<Arc<CrossReplicaGate>>,
}

impl Gates {
    /// The gates over a backend's key turns, if it has them; `margin` is how much longer than
    /// its holder's deadline a turn stays leased. Starts the turn keeper on the calling runtime.
    pub fn new(turns: Option<Arc<dyn TurnStore>>, margin: Duration) -> Gates {
        Gates {
            local: Arc::new(LocalGate::default()),
            cross_replica: turns.map(|turns| Arc::new(CrossReplicaGate::new(turns, margin))),
        }
    }

    /// Only the in-process gate.
    pub fn local_only() -> Gates {
        Gates::new(None, Duration::ZERO)
    }

    /// Waits, at most `wait`, until every write of `key` that took or queued for its turn
    /// before this call, in this process and across replicas, has ended: takes the key's turn
    /// (in this process, then across replicas) and gives it back at once. A claim does this
    /// after raising the mark, so its answer means no older generation reaches the upstream
    /// later (those still queued are refused by their re-check).
    pub async fn wait_for_turn(
        &self,
        key: &str,
        wait: Duration,
    ) -> Result<(), CrossReplicaGateError> {
        let started = std::time::Instant::now();
        let local = tokio::time::timeout(wait, self.local.enter(key))
            .await
            .map_err(|_| CrossReplicaGateError::Timeout(wait))?;
        if let Some(gate) = &self.cross_replica {
            let left = wait.saturating_sub(started.elapsed());
            // Nothing is forwarded under this turn: it is held for one store round.
            let pass = gate.enter(key, left, CLAIM_HOLD).await?;
            drop(pass);
        }
        drop(local);
        Ok(())
    }
}

/// How long a claim's turn is held at most (it is given back as soon as it is taken).
const CLAIM_HOLD: Duration = Duration::from_secs(1);
