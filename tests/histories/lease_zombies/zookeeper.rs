//! The lease-zombie history on ZooKeeper: locks taken as its lock recipe takes them (an ephemeral
//! sequential child in a session of ZooKeeper's minimum, 4 s; the lowest sequence holds), a pause
//! ending when the session expires and its node goes, at the lock node's `pzxid` then.

use std::time::{Duration, Instant};

use zookeeper_client as zk;

use super::service::{Ack, Ended, LockService};
use crate::support::zookeeper::{
    unique_root, zk_contend, zk_delete_tree, zk_gone, zk_holder, zk_observer, Naming, ZkContender,
    ZK_HOSTS,
};
use crate::support::TestGateway;

/// A contender's session: ZooKeeper's minimum (two ticks of 2 s); a paused holder's expires
/// 4–6 s after its last heartbeat.
const SESSION: Duration = Duration::from_secs(4);
/// Longest wait for a lock, or for a session's expiry.
const WAIT: Duration = Duration::from_secs(30);

struct ZookeeperLocks {
    root: String,
    observer: zk::Client,
}

impl ZookeeperLocks {
    fn lock(&self, lock: usize) -> String {
        format!("{}/locks/{lock}", self.root)
    }
}

impl LockService for ZookeeperLocks {
    type Lease = ZkContender;
    const REVISIONS: bool = true;
    const RUN: Duration = Duration::from_secs(10);

    async fn open(locks: usize) -> ZookeeperLocks {
        let service = ZookeeperLocks {
            root: unique_root(),
            observer: zk_observer().await,
        };
        // Each lock node made, its counter past 0: tokens start at 1.
        for lock in 0..locks {
            zk_contend(&service.lock(lock), Naming::Plain, SESSION)
                .await
                .release()
                .await;
        }
        service
    }

    fn authority(&self) -> String {
        format!(
            "kind = \"zookeeper\"\nhosts = \"{ZK_HOSTS}\"\nlock_key = \"{}/locks/{{id}}\"\n",
            self.root
        )
    }

    async fn contend(&self, lock: usize, _worker: usize) -> (ZkContender, Option<Ack>) {
        let mine = zk_contend(&self.lock(lock), Naming::Plain, SESSION).await;
        // The create's zxid: the revision the gateway reaches once it has read the new node.
        let ack = (i64::try_from(mine.czxid).expect("a zxid"), Instant::now());
        (mine, Some(ack))
    }

    fn token(lease: &ZkContender) -> u64 {
        lease.token
    }

    async fn until_holder(&self, lease: &ZkContender) {
        let lock = lease.path.rsplit_once('/').expect("a contender path").0;
        let waiting = Instant::now();
        while zk_holder(&self.observer, lock).await != Some(lease.token) {
            assert!(waiting.elapsed() < WAIT, "{lock}: never held");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn pause_until_ended(
        &self,
        lease: ZkContender,
        _worker: usize,
        _watching: Option<&TestGateway>,
    ) -> Ended {
        let path = lease.path.clone();
        lease.pause();
        Ended::AtRevision(zk_gone(&self.observer, &path, WAIT).await)
    }

    async fn release(&self, lease: ZkContender) -> Option<Ack> {
        // A delete answers no zxid: releases are left out of the lag.
        lease.release().await;
        None
    }

    async fn close(self) {
        zk_delete_tree(&self.observer, &self.root).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombies_of_a_zookeeper_lock_with_and_without_the_authority_watch() {
    super::zombie_history::<ZookeeperLocks>("zookeeper").await;
}
