//! The lease-zombie history on etcd: locks taken as etcd's recipe takes them (a key
//! `<lock>/<lease hex>` under a 2 s lease; the lowest create revision holds), a pause ending when
//! etcd deletes the key, at the delete's revision.

use std::time::{Duration, Instant};

use super::service::{Ack, Ended, LockService};
use crate::support::etcd::{delete_keys, unique_prefix, ETCD_ADDR};
use crate::support::locks::{
    etcd_contend, etcd_holder, etcd_keep_alive, etcd_revoke, EtcdContender, EtcdObserver,
};
use crate::support::TestGateway;

/// The workers' lease, in seconds; their pauses outlast it.
const TTL: u64 = 2;
/// Longest wait for a lock, or for a lease's end.
const WAIT: Duration = Duration::from_secs(20);

struct EtcdLocks {
    prefix: String,
    observer: EtcdObserver,
}

impl EtcdLocks {
    fn lock(&self, lock: usize) -> String {
        format!("{}locks/{lock}", self.prefix)
    }
}

impl LockService for EtcdLocks {
    type Lease = EtcdContender;
    const REVISIONS: bool = true;
    const RUN: Duration = Duration::from_secs(12);

    async fn open(_locks: usize) -> EtcdLocks {
        let prefix = unique_prefix();
        let observer = EtcdObserver::start(&prefix).await;
        EtcdLocks { prefix, observer }
    }

    fn authority(&self) -> String {
        format!(
            "kind = \"etcd\"\nendpoints = [\"http://{ETCD_ADDR}\"]\nlock_key = \"{}locks/{{id}}\"\n",
            self.prefix
        )
    }

    async fn contend(&self, lock: usize, _worker: usize) -> (EtcdContender, Option<Ack>) {
        let mine = etcd_contend(&self.lock(lock), TTL).await;
        let ack = (
            i64::try_from(mine.token).expect("a revision"),
            Instant::now(),
        );
        (mine, Some(ack))
    }

    fn token(lease: &EtcdContender) -> u64 {
        lease.token
    }

    async fn until_holder(&self, lease: &EtcdContender) {
        let lock = lease.key.rsplit_once('/').expect("a contender key").0;
        let mut renewed = Instant::now();
        let waiting = Instant::now();
        while etcd_holder(lock).await != Some(lease.token) {
            assert!(waiting.elapsed() < WAIT, "{lock}: never held");
            if renewed.elapsed() > Duration::from_millis(500) {
                etcd_keep_alive(lease.lease).await;
                renewed = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn pause_until_ended(
        &self,
        lease: EtcdContender,
        _worker: usize,
        _watching: Option<&TestGateway>,
    ) -> Ended {
        Ended::AtRevision(self.observer.deleted(&lease.key, WAIT).await)
    }

    async fn release(&self, lease: EtcdContender) -> Option<Ack> {
        let revision = etcd_revoke(lease.lease).await?;
        Some((revision, Instant::now()))
    }

    async fn close(self) {
        delete_keys(&self.prefix).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombies_of_an_etcd_lock_with_and_without_the_authority_watch() {
    super::zombie_history::<EtcdLocks>("etcd").await;
}
