//! The cross-replica gate (`CrossReplicaGate`) over the key turns of PostgreSQL, Redis and etcd, driven
//! directly: two gates on one store stand for two replicas, one of them behind a relay the test
//! can cut. A held turn keeps the other replica out until released; a lost store connection frees
//! nothing; a turn never released lapses by its lease on the store's clock, not before; a take
//! with a token advances the mark only when it takes the turn; the keeper renews a long turn and
//! cuts the forward of one it cannot renew before the lease lapses; a store that lost its
//! identity refuses every take; on PostgreSQL an ended turn's release is written once another
//! replica wants the key, not before, a holder yields to a replica waiting ahead, three replicas
//! with queues of their own share a hot key, a waiter that gave up leaves the queue, and turn
//! batches over the same keys never deadlock. PostgreSQL (127.0.0.1:5432), Redis (127.0.0.1:6379) and etcd
//! (127.0.0.1:2379) must be running: these tests fail, never skip, when they are not.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencegate::body::full_body;
use fencegate::config::{
    PostgresStoreConfig, RedisStoreConfig, DEFAULT_CACHE_CAPACITY, DEFAULT_MAX_BATCH,
    DEFAULT_POSTGRES_BATCHES_IN_FLIGHT, DEFAULT_TURN_MARGIN,
};
use fencegate::gate::{CrossReplicaGate, CrossReplicaGateError, CrossReplicaPass, LocalGate};
use fencegate::store::{
    EtcdStore, FenceStore, PostgresStore, RedisStore, StoreError, TakeTurn, TurnStore,
};

use crate::support::etcd::ETCD_ADDR;
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::redis::{delete_keys, unique_prefix, REDIS_ADDR};
use crate::support::relay::{Relay, RelayMode};

const POSTGRES_ADDR: &str = "127.0.0.1:5432";
/// Long enough for any store round on a loaded machine; short enough to keep the tests quick.
const HOLD: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug)]
enum Backend {
    Postgres,
    Redis,
    Etcd,
}

impl Backend {
    /// How long after its lease a turn that was never released may still hold its key: etcd
    /// leases count whole seconds, last at least 1.5 s (three halves of the default election
    /// timeout), and the leader ends expired ones every 500 ms.
    fn lapse_slack(self) -> Duration {
        match self {
            Backend::Etcd => Duration::from_secs(3),
            _ => Duration::from_secs(2),
        }
    }
}

/// One store namespace (a schema or a key prefix), shared by the replicas of a test.
struct Namespace {
    backend: Backend,
    name: String,
}

/// One replica: its fence store, its turns and its gate.
struct Replica {
    store: Arc<dyn FenceStore>,
    turns: Arc<dyn TurnStore>,
    gate: CrossReplicaGate,
}

impl Namespace {
    fn new(backend: Backend) -> Namespace {
        let name = match backend {
            Backend::Postgres => unique_schema(),
            Backend::Redis => unique_prefix(),
            Backend::Etcd => crate::support::etcd::unique_prefix(),
        };
        Namespace { backend, name }
    }

    /// A replica reaching the store at `addr` (the server, or a relay in front of it).
    async fn replica(&self, addr: &str, margin: Duration) -> Replica {
        let (store, turns): (Arc<dyn FenceStore>, Arc<dyn TurnStore>) = match self.backend {
            Backend::Postgres => {
                let config = PostgresStoreConfig {
                    url: format!("postgres://postgres@{addr}/test"),
                    schema: self.name.clone(),
                    max_connections: 2,
                    batches_in_flight: DEFAULT_POSTGRES_BATCHES_IN_FLIGHT,
                    turn_margin: margin,
                    max_batch: DEFAULT_MAX_BATCH,
                    cache_capacity: DEFAULT_CACHE_CAPACITY,
                    tls: None,
                };
                let store = PostgresStore::open(&config).await.unwrap_or_else(|e| {
                    panic!("PostgreSQL at {TEST_POSTGRES_URL} is required: {e}")
                });
                let turns = Arc::new(store.turns(&fencegate::guard::Replica::fresh().id));
                (Arc::new(store), turns)
            }
            Backend::Redis => {
                let config = RedisStoreConfig {
                    url: format!("redis://{addr}"),
                    key_prefix: self.name.clone(),
                    require_durable: false,
                    turn_margin: margin,
                    max_batch: DEFAULT_MAX_BATCH,
                    cache_capacity: DEFAULT_CACHE_CAPACITY,
                    tls: None,
                };
                let store = RedisStore::open(&config)
                    .await
                    .unwrap_or_else(|e| panic!("Redis at {REDIS_ADDR} is required: {e}"));
                let turns = Arc::new(store.turns(&fencegate::guard::Replica::fresh().id));
                (Arc::new(store), turns)
            }
            Backend::Etcd => {
                let mut config =
                    super::store_contract_etcd::config(&[format!("http://{addr}")], &self.name);
                config.turn_margin = margin;
                let store = EtcdStore::open(&config)
                    .await
                    .unwrap_or_else(|e| panic!("etcd at {ETCD_ADDR} is required: {e}"));
                let turns = Arc::new(store.turns(&fencegate::guard::Replica::fresh().id));
                (Arc::new(store), turns)
            }
        };
        let gate = CrossReplicaGate::new(Arc::clone(&turns), margin);
        Replica { store, turns, gate }
    }

    fn server(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => POSTGRES_ADDR,
            Backend::Redis => REDIS_ADDR,
            Backend::Etcd => ETCD_ADDR,
        }
    }

    async fn relay(&self) -> Relay {
        let target: SocketAddr = self.server().parse().expect("server address");
        Relay::start(target).await
    }

    async fn clean_up(&self) {
        match self.backend {
            Backend::Postgres => drop_schema(&self.name).await,
            Backend::Redis => delete_keys(&self.name).await,
            Backend::Etcd => crate::support::etcd::delete_keys(&self.name).await,
        }
    }
}

/// Runs `test` on a fresh namespace of `backend` and cleans it up, even when the test fails.
async fn on<F, Fut>(backend: Backend, test: F)
where
    F: FnOnce(Arc<Namespace>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let namespace = Arc::new(Namespace::new(backend));
    let outcome = tokio::spawn(test(Arc::clone(&namespace))).await;
    namespace.clean_up().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn enter(
    replica: &Replica,
    key: &str,
    wait: Duration,
) -> Result<CrossReplicaPass, CrossReplicaGateError> {
    replica.gate.enter(key, wait, HOLD).await
}

/// Whether `replica` gets the key's turn within `wait` (the pass is given back at once).
async fn gets_in(replica: &Replica, key: &str, wait: Duration) -> bool {
    match enter(replica, key, wait).await {
        Ok(_) => true,
        Err(CrossReplicaGateError::Timeout(_)) => false,
        Err(e) => panic!("entering the gate failed: {e}"),
    }
}

async fn a_held_turn_keeps_the_other_replica_out_until_released(backend: Backend) {
    on(backend, |ns| async move {
        let a = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let b = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let held = enter(&a, "k", HOLD).await.expect("a free key is entered");
        assert!(
            !gets_in(&b, "k", Duration::from_millis(300)).await,
            "{backend:?}: both replicas held the key"
        );
        assert!(
            gets_in(&b, "other", HOLD).await,
            "another key is not blocked"
        );
        drop(held);
        assert!(
            gets_in(&b, "k", Duration::from_secs(2)).await,
            "{backend:?}: the released key stayed closed"
        );
    })
    .await;
}

async fn a_lost_store_connection_does_not_free_the_turn(backend: Backend) {
    on(backend, |ns| async move {
        let relay = ns.relay().await;
        let a = ns
            .replica(&relay.addr.to_string(), DEFAULT_TURN_MARGIN)
            .await;
        let b = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let held = enter(&a, "k", HOLD).await.expect("a free key is entered");
        // Every connection of replica A to the store is closed, then the store is back.
        relay.set(RelayMode::Cut);
        tokio::time::sleep(Duration::from_millis(50)).await;
        relay.set(RelayMode::Pass);
        assert!(
            !gets_in(&b, "k", Duration::from_millis(500)).await,
            "{backend:?}: a reset of the holder's store connections freed its turn"
        );
        drop(held);
        assert!(
            gets_in(&b, "k", Duration::from_secs(3)).await,
            "{backend:?}: the turn released over a new connection stayed closed"
        );
    })
    .await;
}

async fn an_unreleased_turn_lapses_by_its_lease_and_not_before(backend: Backend) {
    on(backend, |ns| async move {
        let a = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let b = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let lease = Duration::from_millis(800);
        let started = Instant::now();
        // A holder that dies without releasing: the turn is taken and never given back.
        let taken = a
            .turns
            .take(TakeTurn {
                key: "k".to_owned(),
                turn: 1,
                lease,
                advance: None,
            })
            .await
            .expect("take");
        assert_eq!(taken, Some(None), "a free key is taken, with no mark");
        enter(&b, "k", Duration::from_secs(5))
            .await
            .expect("the lapsed turn is taken");
        let waited = started.elapsed();
        assert!(
            waited >= lease - Duration::from_millis(50),
            "{backend:?}: entered after {waited:?}, before the lease of {lease:?} lapsed"
        );
        assert!(
            waited < lease + backend.lapse_slack(),
            "{backend:?}: entered only after {waited:?}"
        );
    })
    .await;
}

async fn a_take_with_a_token_advances_the_mark_only_when_it_takes_the_turn(backend: Backend) {
    on(backend, |ns| async move {
        let a = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let b = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let (held, replaced) = a
            .gate
            .try_enter_and_advance("k", 5, HOLD)
            .await
            .expect("take")
            .expect("a free key is taken");
        assert_eq!(replaced, None, "the key had no mark");
        assert_eq!(held.mark_under_turn(), None);
        let refused = b
            .gate
            .try_enter_and_advance("k", 9, HOLD)
            .await
            .expect("take");
        assert!(refused.is_none(), "{backend:?}: a held key was taken");
        assert_eq!(
            b.store.current("k").await.expect("read"),
            Some(5),
            "{backend:?}: a take that failed advanced the mark"
        );
        drop(held);
        let mut taken = None;
        for _ in 0..100 {
            taken = b
                .gate
                .try_enter_and_advance("k", 9, HOLD)
                .await
                .expect("take");
            if taken.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (pass, replaced) = taken.expect("the released key is taken");
        assert_eq!(
            replaced,
            Some(5),
            "the advance reports the mark it replaced"
        );
        assert_eq!(pass.mark_under_turn(), Some(5));
        assert_eq!(b.store.current("k").await.expect("read"), Some(9));
        // A lower token takes the turn but leaves the mark as it is. (On PostgreSQL the ended
        // turn is released once A's first try tells B that A wants the key.)
        drop(pass);
        let mut taken = None;
        for _ in 0..100 {
            taken = a
                .gate
                .try_enter_and_advance("k", 7, HOLD)
                .await
                .expect("take");
            if taken.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (_pass, replaced) = taken.expect("taken");
        assert_eq!(replaced, Some(9));
        assert_eq!(
            a.store.current("k").await.expect("read"),
            Some(9),
            "{backend:?}: a mark went down"
        );
    })
    .await;
}

async fn the_keeper_renews_a_long_turn(backend: Backend) {
    on(backend, |ns| async move {
        let margin = Duration::from_millis(500);
        let a = ns.replica(ns.server(), margin).await;
        let b = ns.replica(ns.server(), margin).await;
        let held = enter(&a, "k", HOLD).await.expect("entered");
        // Three leases' worth of time: only renewals keep B out.
        let lease = HOLD + margin;
        assert!(
            !gets_in(&b, "k", lease * 3).await,
            "{backend:?}: the turn lapsed while its holder still renewed it"
        );
        assert!(!held.watch().lapsed(), "a renewed turn was cut");
        drop(held);
        assert!(gets_in(&b, "k", Duration::from_secs(3)).await);
    })
    .await;
}

async fn a_turn_that_cannot_be_renewed_is_cut_before_its_lease_lapses(backend: Backend) {
    on(backend, |ns| async move {
        let margin = Duration::from_secs(1);
        let relay = ns.relay().await;
        let a = ns.replica(&relay.addr.to_string(), margin).await;
        let b = ns.replica(ns.server(), margin).await;
        let started = Instant::now();
        let held = enter(&a, "k", HOLD).await.expect("entered");
        let watch = held.watch();
        watch.hold_body(full_body("a response still streaming"));
        // The holder loses the store for good: no renewal can reach it.
        relay.set(RelayMode::Cut);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !watch.lapsed() {
            assert!(Instant::now() < deadline, "the turn was never cut");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cut_after = started.elapsed();
        assert!(watch.body().is_none(), "the cut turn's body was not dropped");
        // The keeper cuts within its last tick before the deadline; this loop looks every 20 ms.
        assert!(
            cut_after <= HOLD + Duration::from_millis(100),
            "{backend:?}: cut only after {cut_after:?}, past its hold of {HOLD:?}"
        );
        // The other replica gets the key only once the lease itself lapsed.
        enter(&b, "k", Duration::from_secs(5)).await.expect("the lapsed turn is taken");
        let entered_after = started.elapsed();
        assert!(
            entered_after >= HOLD + margin - Duration::from_millis(100),
            "{backend:?}: the other replica entered after {entered_after:?}, before the lease lapsed"
        );
        drop(held);
    })
    .await;
}

async fn a_store_that_lost_its_identity_refuses_takes(backend: Backend) {
    on(backend, |ns| async move {
        let a = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let identity = a.store.identity().await.expect("identity");
        a.store.expect_identity(&identity.id);
        assert!(
            enter(&a, "k", HOLD).await.is_ok(),
            "the adopted store refused a take"
        );
        a.store.expect_identity("another-store");
        let refused = a.gate.try_enter_and_advance("k2", 3, HOLD).await;
        assert!(
            matches!(refused, Err(StoreError::Untrusted { .. })),
            "{backend:?}: a store with another identity answered {:?}",
            refused.map(|r| r.map(|(_, mark)| mark))
        );
        a.store.expect_identity(&identity.id);
        assert_eq!(
            a.store.current("k2").await.expect("read"),
            None,
            "the refused take advanced"
        );
    })
    .await;
}

macro_rules! on_every_network_backend {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Postgres).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Redis).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Etcd).await;
                }
            )*
        }
    };
}

on_every_network_backend!(
    a_held_turn_keeps_the_other_replica_out_until_released,
    a_lost_store_connection_does_not_free_the_turn,
    an_unreleased_turn_lapses_by_its_lease_and_not_before,
    a_take_with_a_token_advances_the_mark_only_when_it_takes_the_turn,
    the_keeper_renews_a_long_turn,
    a_turn_that_cannot_be_renewed_is_cut_before_its_lease_lapses,
    a_store_that_lost_its_identity_refuses_takes,
);

/// On PostgreSQL a holder writes the release of an ended turn only once another replica wants the
/// key (its take notifies the holder): until then the row still names the holder's turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_ended_turn_is_released_when_another_replica_wants_it() {
    on(Backend::Postgres, |ns| async move {
        let a = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let b = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        // The first release starts the holder's listener (written at once: nobody listens yet).
        drop(enter(&a, "first", HOLD).await.expect("entered"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(enter(&a, "k", HOLD).await.expect("entered"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(TEST_POSTGRES_URL)
            .await
            .expect("PostgreSQL");
        let still_leased: bool = sqlx::query_scalar(&format!(
            "SELECT turn_expires > now() FROM {}.fence_marks WHERE key = 'k'",
            ns.name
        ))
        .fetch_one(&pool)
        .await
        .expect("the key's row");
        assert!(
            still_leased,
            "the ended turn's release was written though nobody wanted the key"
        );
        let started = Instant::now();
        assert!(
            gets_in(&b, "k", Duration::from_secs(2)).await,
            "the wanted key was never released"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the wanted key took {:?} to be released",
            started.elapsed()
        );
    })
    .await;
}

/// On PostgreSQL replicas waiting for a key are served in the order they asked: a holder whose
/// turn is over does not take the key back while another replica waits ahead of it (it yields).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_holder_yields_to_a_replica_waiting_ahead() {
    on(Backend::Postgres, |ns| async move {
        let a = Arc::new(ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await);
        let b = Arc::new(ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await);
        let held = enter(&a, "k", HOLD).await.expect("a entered");
        let started = Instant::now();
        let b_waits = {
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                let pass = enter(&b, "k", Duration::from_secs(5)).await;
                let at = started.elapsed();
                // Hold the turn long enough for the order to be plain.
                tokio::time::sleep(Duration::from_millis(50)).await;
                drop(pass.expect("b entered"));
                at
            })
        };
        // B has asked (and been refused) before A's turn ends.
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(held);
        let again = enter(&a, "k", Duration::from_secs(5)).await;
        let a_again_at = started.elapsed();
        drop(again.expect("a entered again"));
        let b_at = b_waits.await.expect("b's task");
        assert!(
            b_at < a_again_at,
            "A took the key back at {a_again_at:?} though B had waited for it since before (B got in at {b_at:?})"
        );
    })
    .await;
}

/// On PostgreSQL three replicas, each with a queue of its own writes to one hot key (behind an
/// in-process gate, as in the gateway), all get turns: none is kept out until its gate timeout
/// by another that keeps taking the key back for its own next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_three_replicas_share_a_hot_key() {
    on(Backend::Postgres, |ns| async move {
        const WRITERS_PER_REPLICA: usize = 4;
        const RUN: Duration = Duration::from_secs(3);
        let wait = Duration::from_secs(2);
        let mut replicas = Vec::new();
        for _ in 0..3 {
            let replica = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
            replicas.push(Arc::new((replica, Arc::new(LocalGate::default()))));
        }
        let started = Instant::now();
        let mut writers = Vec::new();
        for (index, replica) in replicas.iter().enumerate() {
            for _ in 0..WRITERS_PER_REPLICA {
                let replica = Arc::clone(replica);
                writers.push(tokio::spawn(async move {
                    let (replica, local) = &*replica;
                    let (mut turns, mut timeouts) = (0usize, 0usize);
                    while started.elapsed() < RUN {
                        let Ok(_local) = tokio::time::timeout(wait, local.enter("hot")).await
                        else {
                            timeouts += 1;
                            continue;
                        };
                        match enter(replica, "hot", wait).await {
                            Ok(pass) => {
                                tokio::time::sleep(Duration::from_millis(2)).await;
                                drop(pass);
                                turns += 1;
                            }
                            Err(CrossReplicaGateError::Timeout(_)) => timeouts += 1,
                            Err(e) => panic!("entering the gate failed: {e}"),
                        }
                    }
                    (index, turns, timeouts)
                }));
            }
        }
        let mut turns = [0usize; 3];
        let mut timeouts = [0usize; 3];
        for writer in writers {
            let (index, t, out) = writer.await.expect("writer");
            turns[index] += t;
            timeouts[index] += out;
        }
        let total: usize = turns.iter().sum();
        assert_eq!(
            timeouts, [0; 3],
            "writes timed out waiting for the key (turns per replica {turns:?})"
        );
        for (index, got) in turns.iter().enumerate() {
            assert!(
                *got * 6 >= total,
                "replica {index} got {got} of {total} turns (per replica {turns:?}): not its share"
            );
        }
    })
    .await;
}

/// On PostgreSQL a replica whose waiting request gave up leaves the key's queue: the holder takes
/// the key again at once, instead of yielding to a waiter that is gone until it counts as stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_waiter_that_gives_up_leaves_the_queue() {
    on(Backend::Postgres, |ns| async move {
        let a = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let b = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let held = enter(&a, "k", HOLD).await.expect("a entered");
        assert!(
            !gets_in(&b, "k", Duration::from_millis(300)).await,
            "b got in while a held the key"
        );
        drop(held);
        assert!(
            gets_in(&a, "k", Duration::from_millis(500)).await,
            "a could not take the key back after the only other waiter gave up"
        );
    })
    .await;
}

/// PostgreSQL's count of deadlocks it broke in the test database. A backend reports its count
/// when it ends, so the replicas are closed before the second reading.
async fn deadlocks() -> i64 {
    let mut connection = crate::support::postgres::connect().await;
    sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(&mut connection)
        .await
        .expect("read pg_stat_database")
}

/// On PostgreSQL turn batches of three replicas that take, advance and release the same hot keys,
/// each batch holding several of them in its own order, never deadlock: every batch locks its
/// keys' rows first, in one order. (Before, PostgreSQL broke such deadlocks after
/// `deadlock_timeout`, failing one batch each time.) The hot keys are new every 100 ms, so that
/// batches race to create their rows (a row another batch creates is one the lock before could
/// not see); some writers hold their turns past half their lease, so that renewals run, and some
/// give up waiting after 50 ms, so that they leave the keys' queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_turn_batches_over_the_same_keys_do_not_deadlock() {
    on(Backend::Postgres, |ns| async move {
        use rand::{Rng as _, SeedableRng as _};
        const KEYS: usize = 6;
        const WRITERS_PER_REPLICA: usize = 12;
        const RUN: Duration = Duration::from_secs(3);
        let wait = Duration::from_secs(2);
        let before = deadlocks().await;
        let mut replicas = Vec::new();
        for _ in 0..3 {
            replicas.push(Arc::new(ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await));
        }
        let tokens = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let started = Instant::now();
        let mut writers = Vec::new();
        for (index, replica) in replicas.iter().enumerate() {
            for writer in 0..WRITERS_PER_REPLICA {
                let replica = Arc::clone(replica);
                let tokens = Arc::clone(&tokens);
                let seed = (index * WRITERS_PER_REPLICA + writer) as u64;
                writers.push(tokio::spawn(async move {
                    let mut random = rand::rngs::StdRng::seed_from_u64(seed);
                    let mut turns = 0usize;
                    while started.elapsed() < RUN {
                        let wave = started.elapsed().as_millis() / 25;
                        let key = format!("hot-{wave}-{}", random.gen_range(0..KEYS));
                        if random.gen_bool(0.5) {
                            let (wait, hold) = match writer % 4 {
                                0 => (Duration::from_millis(50), Duration::ZERO),
                                1 => (wait, HOLD * 3 / 5),
                                _ => (wait, Duration::ZERO),
                            };
                            match enter(&replica, &key, wait).await {
                                Ok(pass) => {
                                    tokio::time::sleep(hold).await;
                                    drop(pass);
                                    turns += 1;
                                }
                                Err(CrossReplicaGateError::Timeout(_)) => {}
                                Err(e) => panic!("entering the gate failed: {e}"),
                            }
                        } else {
                            let token = tokens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            match replica.gate.try_enter_and_advance(&key, token, HOLD).await {
                                Ok(Some((pass, _))) => {
                                    drop(pass);
                                    turns += 1;
                                }
                                Ok(None) => tokio::task::yield_now().await,
                                Err(e) => panic!("taking with an advance failed: {e}"),
                            }
                        }
                    }
                    turns
                }));
            }
        }
        let mut turns = 0;
        for writer in writers {
            turns += writer.await.expect("writer");
        }
        for replica in &replicas {
            replica.gate.close().await;
            let _ = replica.turns.close().await;
            let _ = replica.store.close().await;
        }
        drop(replicas);
        // The backends report their counts as they end, just after their connections close.
        let mut after = deadlocks().await;
        for _ in 0..20 {
            if after != before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            after = deadlocks().await;
        }
        assert!(turns > 0, "no turn was taken");
        assert_eq!(
            after - before,
            0,
            "PostgreSQL broke deadlocks between turn batches ({turns} turns taken)"
        );
    })
    .await;
}

/// A connection to the test database whose search path is the namespace's schema.
async fn schema_connection(ns: &Namespace) -> sqlx::PgConnection {
    let mut connection = crate::support::postgres::connect().await;
    sqlx::query(&format!("SET search_path TO {}", ns.name))
        .execute(&mut connection)
        .await
        .expect("set the search path");
    connection
}

/// One `fencegate_turn_batch` call taking `keys` for `holder` (turn 1, a minute's lease, no
/// advance): whether each was taken.
async fn turn_batch(
    connection: &mut sqlx::PgConnection,
    holder: &str,
    keys: &[&str],
) -> Result<Vec<bool>, sqlx::Error> {
    let ones = vec![1i64; keys.len()];
    let leases = vec![60_000i64; keys.len()];
    let tokens: Vec<Option<i64>> = vec![None; keys.len()];
    sqlx::query_scalar(
        "SELECT taken FROM fencegate_turn_batch($1, NULL, '{}', '{}', $2, $3, $4, $5, 1000) \
         ORDER BY n",
    )
    .bind(holder)
    .bind(keys)
    .bind(&ones)
    .bind(&leases)
    .bind(&tokens)
    .fetch_all(connection)
    .await
}

/// The race of a key's first take, played out step by step on PostgreSQL: batch A has created the
/// row of k1 and not committed; batch B names k0 (an old row) and k1; A then takes k0 as well.
/// B must not hold k0 while it waits for k1, or the two wait for each other. (Before migration
/// 0007 B locked k0, the only row its snapshot held, and PostgreSQL broke the deadlock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_batch_waits_for_a_row_being_created_before_it_locks_any() {
    on(Backend::Postgres, |ns| async move {
        let replica = ns.replica(ns.server(), DEFAULT_TURN_MARGIN).await;
        let mut a = schema_connection(&ns).await;
        let mut b = schema_connection(&ns).await;
        sqlx::query("INSERT INTO fence_marks (key) VALUES ('k0')")
            .execute(&mut a)
            .await
            .expect("the old row");
        sqlx::query("BEGIN").execute(&mut a).await.expect("begin");
        let first = turn_batch(&mut a, "a", &["k1"]).await.expect("a takes k1");
        assert_eq!(first, [true]);
        let b_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut b)
            .await
            .expect("b's pid");
        let second = tokio::spawn(async move { turn_batch(&mut b, "b", &["k0", "k1"]).await });
        // B waits for A's transaction (the row A created).
        let mut observer = schema_connection(&ns).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let waiting: bool = sqlx::query_scalar(
                "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity \
                 WHERE pid = $1",
            )
            .bind(b_pid)
            .fetch_optional(&mut observer)
            .await
            .expect("read pg_stat_activity")
            .unwrap_or(false);
            if waiting {
                break;
            }
            assert!(Instant::now() < deadline, "b never waited for a's row");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let k0 = tokio::time::timeout(Duration::from_secs(10), turn_batch(&mut a, "a", &["k0"]))
            .await
            .expect("a's second batch answered");
        let k0 = k0.unwrap_or_else(|e| panic!("a's take of k0 failed: {e}"));
        assert_eq!(k0, [true], "a did not take k0");
        sqlx::query("COMMIT").execute(&mut a).await.expect("commit");
        let second = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("b's batch answered")
            .expect("b's task");
        let second = second.unwrap_or_else(|e| panic!("b's batch failed: {e}"));
        assert_eq!(second, [false, false], "b took a key a holds");
        drop(replica);
    })
    .await;
}
