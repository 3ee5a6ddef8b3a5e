//! What the lease-zombie history needs of a lock service: contend for a lock, wait to hold it,
//! pause until the lease has visibly ended, release it, and the authority table that follows it.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::support::TestGateway;

/// A change acknowledged to a lock client (a contender's grant or a release): the revision it
/// made, and when.
pub(super) type Ack = (i64, Instant);

/// How far a paused holder's lease had ended when its zombie writes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ended {
    /// Visible at this revision: the gateway has seen it once `/admin/authorities` reports it.
    AtRevision(i64),
    /// No revision, but the gateway waited for had applied the end; `lag`: how long a change
    /// made after the end took to reach the gateway's marks.
    Applied { lag: Duration },
    /// No revision and no gateway waited for: visible in the service, maybe not to the gateway.
    Visible,
}

/// A lock service the history runs on. One value per mode's run: its locks are its own.
pub(super) trait LockService: Send + Sync + Sized + 'static {
    type Lease: Send + 'static;
    /// Whether the service has revisions, which `/admin/authorities` reports.
    const REVISIONS: bool;
    /// How long each mode runs: long enough for at least two pauses of every lock.
    const RUN: Duration;

    /// Sets up `locks` fresh locks (each mapped to resource `res:<index>`).
    fn open(locks: usize) -> impl Future<Output = Self> + Send;

    /// `[routes.fence.authority]`'s keys for these locks, without `require_live_lease` and
    /// `strict`.
    fn authority(&self) -> String;

    /// Joins `lock`'s contenders as `worker` (returning once it holds, where the service has no
    /// queue), with the grant's acknowledgement where the service has revisions.
    fn contend(
        &self,
        lock: usize,
        worker: usize,
    ) -> impl Future<Output = (Self::Lease, Option<Ack>)> + Send;

    /// The token a holder of `lease` writes with.
    fn token(lease: &Self::Lease) -> u64;

    /// Waits until `lease` holds its lock, keeping it alive meanwhile.
    fn until_holder(&self, lease: &Self::Lease) -> impl Future<Output = ()> + Send;

    /// The holder of `lease` pauses past it: no more renewals, until the lease has ended in the
    /// service. Where the service has no revision and `watching` is given, waits further until
    /// that gateway has applied the end.
    fn pause_until_ended(
        &self,
        lease: Self::Lease,
        worker: usize,
        watching: Option<&TestGateway>,
    ) -> impl Future<Output = Ended> + Send;

    /// Unlocks: the release's acknowledgement where the service has revisions.
    fn release(&self, lease: Self::Lease) -> impl Future<Output = Option<Ack>> + Send;

    /// Removes the run's locks.
    fn close(self) -> impl Future<Output = ()> + Send;
}
