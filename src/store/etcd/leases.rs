//! The etcd leases key turns are attached to, shared: a turn takes the newest lease of its length
//! while that lease still has the whole of the turn's time left, so a gateway grants about one
//! lease per second per turn length instead of one per turn. A shared lease is never revoked
//! (that would end every turn on it): a released turn's key is deleted and the lease lapses on
//! its own. A turn may therefore outlive its asked length by up to [`SHARED_FOR`] plus etcd's
//! rounding to whole seconds, never fall short of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::error::{unexpected, wrap};
use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{LeaseGrantRequest, LeaseGrantResponse};
use crate::store::StoreError;

/// How long past a turn's asked end its lease may last: the time a lease is shared for.
pub(super) const SHARED_FOR: Duration = Duration::from_secs(1);

/// Whole seconds of a lease, rounded up: etcd's leases count seconds, and a turn must not lapse
/// before the time it was taken for.
pub(super) fn lease_seconds(lease: Duration) -> i64 {
    let seconds = lease.as_secs() + u64::from(lease.subsec_nanos() > 0);
    i64::try_from(seconds.max(1)).unwrap_or(i64::MAX)
}

/// A granted lease, and the time its grant was asked for (it lasts at least its length from then).
#[derive(Clone, Copy)]
struct Granted {
    id: i64,
    asked: Instant,
    length: Duration,
}

/// The newest lease of each length this gateway granted for its turns.
pub(super) struct SharedLeases {
    client: Arc<EtcdClient>,
    newest: Mutex<HashMap<i64, Granted>>,
}

impl SharedLeases {
    pub(super) fn new(client: Arc<EtcdClient>) -> SharedLeases {
        SharedLeases {
            client,
            newest: Mutex::new(HashMap::new()),
        }
    }

    /// A lease that lasts at least `turn` from now: the newest shared one while it does, else a
    /// new one (granted once, whoever else asks meanwhile waits for it).
    pub(super) async fn for_turn(&self, turn: Duration) -> Result<i64, StoreError> {
        let seconds = lease_seconds(turn + SHARED_FOR);
        let mut newest = self.newest.lock().await;
        if let Some(lease) = newest.get(&seconds) {
            if lease.asked + lease.length >= Instant::now() + turn {
                return Ok(lease.id);
            }
        }
        let asked = Instant::now();
        let id = self.grant(seconds).await?;
        newest.insert(
            seconds,
            Granted {
                id,
                asked,
                length: Duration::from_secs(seconds.unsigned_abs()),
            },
        );
        Ok(id)
    }

    /// A new lease of at least `ttl` seconds (etcd may grant more: its leases last at least
    /// about one and a half election timeouts).
    async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        let answer: LeaseGrantResponse = self
            .client
            .call("/v3/lease/grant", &LeaseGrantRequest { ttl })
            .await
            .map_err(wrap)?;
        if !answer.error.is_empty() || answer.id == 0 || answer.ttl < ttl {
            return Err(unexpected(format!(
                "lease grant of {ttl}s answered lease {} of {}s {}",
                answer.id, answer.ttl, answer.error
            )));
        }
        Ok(answer.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_whole_seconds_rounded_up() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1_000)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1_001)), 2);
        assert_eq!(lease_seconds(Duration::ZERO), 1);
    }
}
