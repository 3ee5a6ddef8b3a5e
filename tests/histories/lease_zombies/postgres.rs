//! The lease-zombie history on a PostgreSQL lease table (1 s leases, expiring by the database's
//! clock). The table has no revision, so a zombie waits, in watch mode, until the gateway's marks
//! show two changes made to the table after the lease's end (a beacon lock taken twice).

use std::time::{Duration, Instant};

use sqlx::postgres::{PgPool, PgPoolOptions};

use super::service::{Ack, Ended, LockService};
use crate::support::leases;
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::TestGateway;

/// The workers' lease; their pauses outlast it.
const TTL_MS: u64 = 1000;
/// How often the gateway reads the table.
const POLL_INTERVAL: &str = "20ms";
/// Longest wait for a lock, or for the gateway to show a change.
const WAIT: Duration = Duration::from_secs(20);
/// Workers, and the beacon changes, on connections of their own.
const CONNECTIONS: u32 = 8;

struct LeaseTable {
    pool: PgPool,
    schema: String,
}

/// A lease held in the table.
struct Lease {
    lock: String,
    fence: u64,
}

impl LeaseTable {
    /// Takes `worker`'s beacon (`lock:beacon-<worker>`, resource `res:beacon-<worker>`) twice,
    /// each time until the gateway's mark shows it. The gateway reads the table in one statement
    /// at a time: the read that showed the second take began after one that showed the first had
    /// ended, so after anything that ended before the first, and was applied before its mark was
    /// raised. Answers how long the first took to show.
    async fn until_applied(&self, gateway: &TestGateway, worker: usize) -> Duration {
        let lock = format!("lock:beacon-{worker}");
        let resource = format!("res:beacon-{worker}");
        let mut lag = None;
        for _ in 0..2 {
            let fence = leases::seize(&self.pool, &self.schema, &lock, "beacon", 600_000).await;
            let taken = Instant::now();
            loop {
                let mark = gateway.store().current(&resource).await.expect("the store");
                if mark.is_some_and(|mark| mark >= fence) {
                    break;
                }
                assert!(
                    taken.elapsed() < WAIT,
                    "{lock}: fence {fence} not shown within {WAIT:?} (mark {mark:?})"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            lag.get_or_insert(taken.elapsed());
        }
        lag.expect("two takes")
    }
}

impl LockService for LeaseTable {
    type Lease = Lease;
    const REVISIONS: bool = false;
    const RUN: Duration = Duration::from_secs(8);

    async fn open(_locks: usize) -> LeaseTable {
        let pool = PgPoolOptions::new()
            .max_connections(CONNECTIONS)
            .connect(TEST_POSTGRES_URL)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {TEST_POSTGRES_URL} is required: {e}"));
        let schema = unique_schema();
        leases::create_table(&pool, &schema).await;
        LeaseTable { pool, schema }
    }

    fn authority(&self) -> String {
        format!(
            "kind = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\ntable = \"{}.lock_leases\"\nlock_key = \"lock:{{id}}\"\npoll_interval = \"{POLL_INTERVAL}\"\n",
            self.schema
        )
    }

    async fn contend(&self, lock: usize, worker: usize) -> (Lease, Option<Ack>) {
        let lock = format!("lock:{lock}");
        let owner = format!("worker-{worker}");
        let waiting = Instant::now();
        loop {
            if let Some(fence) =
                leases::acquire(&self.pool, &self.schema, &lock, &owner, TTL_MS).await
            {
                return (Lease { lock, fence }, None);
            }
            assert!(waiting.elapsed() < WAIT, "{lock}: never held");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn token(lease: &Lease) -> u64 {
        lease.fence
    }

    /// Taking the lock is holding it: there is no queue.
    async fn until_holder(&self, _lease: &Lease) {}

    async fn pause_until_ended(
        &self,
        lease: Lease,
        worker: usize,
        watching: Option<&TestGateway>,
    ) -> Ended {
        let paused = Instant::now();
        while !leases::ended(&self.pool, &self.schema, &lease.lock, lease.fence).await {
            assert!(paused.elapsed() < WAIT, "{}: never ended", lease.lock);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        match watching {
            Some(gateway) => Ended::Applied {
                lag: self.until_applied(gateway, worker).await,
            },
            None => Ended::Visible,
        }
    }

    async fn release(&self, lease: Lease) -> Option<Ack> {
        leases::release(&self.pool, &self.schema, &lease.lock, lease.fence).await;
        None
    }

    async fn close(self) {
        self.pool.close().await;
        drop_schema(&self.schema).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombies_of_a_postgres_lease_with_and_without_the_authority_watch() {
    super::zombie_history::<LeaseTable>("postgres").await;
}
