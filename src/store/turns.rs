//! A key's turn across replicas, kept in the store as a lease (docs/design.md §4.5): the trait each
//! network backend implements (`postgres/turns.rs`, `redis/turns.rs`, `etcd/turns.rs`) and what
//! one take, release or renewal names. A turn belongs to one replica (`holder`, random per process) and is numbered
//! within it.

use std::sync::Arc;
use std::time::Duration;

use super::StoreFuture;

/// How often a replica waiting for a key's turn asks again at least, even when the store tells
/// it of releases: a backend may count a waiter that has not asked for a few of these as gone.
pub const WAITER_RETRY: Duration = Duration::from_millis(250);

/// Called with a key whose turn was released while some replica waits for it.
pub type TurnFreed = Arc<dyn Fn(&str) + Send + Sync>;

/// One take of a key's turn.
#[derive(Debug, Clone)]
pub struct TakeTurn {
    pub key: String,
    pub turn: u64,
    /// How long the store keeps the turn if it is neither released nor renewed.
    pub lease: Duration,
    /// A token to compare-and-advance the key's mark to, in the same atomic step as the take.
    pub advance: Option<u64>,
}

/// One lease to extend.
#[derive(Debug, Clone)]
pub struct Renewal {
    pub key: String,
    pub turn: u64,
    pub lease: Duration,
}

/// A backend's key turns. Takes, releases and renewals of one serving thread are batched where
/// the backend allows; every expiry is measured by the store's clock, never the gateway's.
pub trait TurnStore: Send + Sync + 'static {
    /// Takes the key's turn if it is free: no lease, a lapsed one, or one of this replica's own
    /// (a replica takes a key only under its in-process turn, so an own lease is an earlier turn
    /// that is over). `Some(mark)`: taken, with the key's mark as found once the turn was held
    /// (before the take's own advance; `None` for a key without one). `None`: another replica
    /// holds the key, and nothing was advanced. Taking the same turn again succeeds again.
    fn take(&self, take: TakeTurn) -> StoreFuture<'_, Option<Option<u64>>>;
    /// Gives a turn (taken for `lease`) back, in the background. A release the store does not
    /// get leaves the lease to lapse (or to this replica's next take of the key); one for a turn
    /// not held does nothing. A backend may write it only once another replica wants the key.
    fn release(&self, key: String, turn: u64, lease: Duration);
    /// Extends leases still held by this replica; answers, per renewal in order, whether it was.
    fn renew(&self, renewals: Vec<Renewal>) -> StoreFuture<'_, Vec<bool>>;
    /// No take is started after this; releases held back (see `release`) are written.
    fn close(&self) -> StoreFuture<'_, ()>;
    /// Has `freed` called with each key released while a replica waits for it; `false` when the
    /// backend does not tell (its waiters poll).
    fn tell_frees(&self, freed: TurnFreed) -> bool {
        let _ = freed;
        false
    }
    /// This replica no longer waits for the key (its waiting request gave up), in the background;
    /// for backends that serve waiters in order.
    fn leave(&self, key: String) {
        let _ = key;
    }
}
