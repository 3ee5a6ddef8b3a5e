//! The PostgreSQL store keeps the `FenceStore` contract (`tests/support/contract.rs`) and the
//! `IntentStore` contract (`tests/support/intent_contract.rs`), each in a schema of its own that
//! is dropped afterwards. PostgreSQL must be running on 127.0.0.1:5432 (start it
//! with `scripts/ensure-services.sh`): these tests fail, never skip, when it is not.

use std::sync::Arc;

use fencegate::config::Compare;
use fencegate::config::{
    PostgresStoreConfig, DEFAULT_CACHE_CAPACITY, DEFAULT_MAX_BATCH,
    DEFAULT_POSTGRES_BATCHES_IN_FLIGHT,
};
use fencegate::store::{
    Advance, AdvanceAndBegin, BeginRequest, Begun, FenceStore, IntentStore, PostgresStore,
};

use crate::support;
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};

fn config(schema: &str) -> PostgresStoreConfig {
    PostgresStoreConfig {
        url: TEST_POSTGRES_URL.to_owned(),
        schema: schema.to_owned(),
        max_connections: 8,
        batches_in_flight: DEFAULT_POSTGRES_BATCHES_IN_FLIGHT,
        turn_margin: fencegate::config::DEFAULT_TURN_MARGIN,
        max_batch: DEFAULT_MAX_BATCH,
        cache_capacity: DEFAULT_CACHE_CAPACITY,
        tls: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_keeps_the_contract() {
    let schema = unique_schema();
    let config = config(&schema);
    support::contract::keeps_the_contract(|| async {
        let store = PostgresStore::open(&config).await.unwrap_or_else(|e| {
            panic!("PostgreSQL at {TEST_POSTGRES_URL} is required (scripts/ensure-services.sh starts it): {e}")
        });
        Arc::new(store) as Arc<dyn FenceStore>
    })
    .await;
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_keeps_the_intent_contract() {
    let schema = unique_schema();
    let store = Arc::new(PostgresStore::open(&config(&schema)).await.unwrap_or_else(|e| {
        panic!("PostgreSQL at {TEST_POSTGRES_URL} is required (scripts/ensure-services.sh starts it): {e}")
    }));
    support::intent_contract::keeps_the_intent_contract(Arc::clone(&store) as Arc<dyn IntentStore>)
        .await;
    store.close().await.unwrap();
    drop_schema(&schema).await;
}

/// An idempotent write's advance and begin in one statement: the shared contract, then what only
/// batching can show — many writes at once (one statement for many of them), two writes of one
/// key in flight together, and intents whose key already has a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_advances_and_begins_in_one_statement() {
    let schema = unique_schema();
    let store = Arc::new(PostgresStore::open(&config(&schema)).await.unwrap_or_else(|e| {
        panic!("PostgreSQL at {TEST_POSTGRES_URL} is required (scripts/ensure-services.sh starts it): {e}")
    }));
    support::intent_contract::advance_and_begin_agrees_with_separate_calls(
        store.as_ref(),
        store.as_ref(),
        store.as_ref(),
    )
    .await;

    let now = 5_000_000;
    let begin = |key: &str, fence: u64| BeginRequest {
        key: key.to_owned(),
        route: "payouts".to_owned(),
        fence,
        fingerprint: "fp".to_owned(),
        attempt: uuid::Uuid::new_v4().to_string(),
        attempt_expires_ms: now + 60_000,
        now_ms: now,
        expires_ms: now + 86_400_000,
    };
    // 200 writes of their own keys at once: every one advanced and begun, each intent stored.
    let writes = (0..200u64).map(|i| {
        let store = Arc::clone(&store);
        let request = begin(&format!("many:{i}"), 10 + i);
        tokio::spawn(async move {
            store
                .advance_and_begin(&format!("many-key:{i}"), 10 + i, Compare::Strict, request)
                .await
        })
    });
    for (i, write) in futures_util::future::join_all(writes)
        .await
        .into_iter()
        .enumerate()
    {
        let answer = write.expect("task").expect("answer");
        assert_eq!(answer.advance, Advance::Accepted { previous: None }, "{i}");
        assert_eq!(
            answer.begun.expect("begun").expect("begin"),
            Begun::Fresh,
            "{i}"
        );
    }
    for i in 0..200u64 {
        let record = store
            .get(&format!("many:{i}"))
            .await
            .unwrap()
            .expect("stored");
        assert_eq!(record.fence, 10 + i);
    }

    // Two writes of one key in flight together, under strict: the larger token passes and
    // begins its intent, the smaller is stale (whichever order they reach the store in) and
    // begins nothing.
    for round in 0..20u64 {
        let key = format!("pair-key:{round}");
        let (low, high) = (100 + 2 * round, 101 + 2 * round);
        let (a, b) = tokio::join!(
            store.advance_and_begin(
                &key,
                low,
                Compare::Strict,
                begin(&format!("pair:{round}:low"), low)
            ),
            store.advance_and_begin(
                &key,
                high,
                Compare::Strict,
                begin(&format!("pair:{round}:high"), high)
            ),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(
            b.advance,
            Advance::Accepted {
                previous: b_previous(&a.advance, low)
            }
        );
        assert_eq!(b.begun.expect("begun").unwrap(), Begun::Fresh);
        let low_stored = store.get(&format!("pair:{round}:low")).await.unwrap();
        match a.advance {
            Advance::Accepted { .. } => {
                assert_eq!(a.begun.expect("begun").unwrap(), Begun::Fresh);
                assert!(low_stored.is_some());
            }
            Advance::Stale { current } => {
                assert_eq!(current, high);
                assert!(a.begun.is_none());
                assert_eq!(low_stored, None, "a stale write began an intent");
            }
        }
    }

    // An intent key that already has a record: the advance passes, and the begin answers as a
    // separate `begin` would (here: a duplicate in flight).
    let first = store
        .advance_and_begin("dup-key", 1, Compare::Monotonic, begin("dup", 1))
        .await
        .unwrap();
    assert_eq!(first.begun.expect("begun").unwrap(), Begun::Fresh);
    let again = store
        .advance_and_begin("dup-key", 2, Compare::Monotonic, begin("dup", 2))
        .await
        .unwrap();
    assert_eq!(again.advance, Advance::Accepted { previous: Some(1) });
    assert!(matches!(
        again.begun.expect("begun").unwrap(),
        Begun::InFlight { .. }
    ));

    store.close().await.unwrap();
    drop_schema(&schema).await;
}

/// The mark the larger of two tokens replaced: the smaller's when that one passed first.
fn b_previous(smaller: &Advance, low: u64) -> Option<u64> {
    match smaller {
        Advance::Accepted { .. } => Some(low),
        Advance::Stale { .. } => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_on_two_replicas_start_one_attempt() {
    let schema = unique_schema();
    let open = || async {
        Arc::new(PostgresStore::open(&config(&schema)).await.unwrap_or_else(|e| {
            panic!("PostgreSQL at {TEST_POSTGRES_URL} is required (scripts/ensure-services.sh starts it): {e}")
        }))
    };
    let replicas = [open().await, open().await];
    let attempts = (0..32).map(|n| {
        let store = Arc::clone(&replicas[n % 2]);
        tokio::spawn(async move {
            store
                .begin(BeginRequest {
                    key: "twice:1".to_owned(),
                    route: "payouts".to_owned(),
                    fence: 3,
                    fingerprint: "fp".to_owned(),
                    attempt: format!("attempt-{n}"),
                    attempt_expires_ms: 61_000,
                    now_ms: 1_000,
                    expires_ms: 86_401_000,
                })
                .await
                .unwrap()
        })
    });
    // Spawn them all before awaiting any: a lazy iterator would run them one after another.
    let attempts: Vec<_> = attempts.collect();
    let mut fresh = 0;
    for attempt in attempts {
        match attempt.await.unwrap() {
            Begun::Fresh => fresh += 1,
            Begun::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one replica may call the provider");
    for replica in &replicas {
        replica.close().await.unwrap();
    }
    drop_schema(&schema).await;
}

#[tokio::test]
async fn migrating_twice_is_harmless_and_an_unreachable_server_is_a_clear_error() {
    let schema = unique_schema();
    fencegate::store::migrate_postgres(&config(&schema))
        .await
        .expect("first migration");
    fencegate::store::migrate_postgres(&config(&schema))
        .await
        .expect("second migration is a no-op");
    drop_schema(&schema).await;

    let mut unreachable = config(&schema);
    unreachable.url = format!(
        "postgres://app:hunter2@{}/test",
        support::process::free_port()
    );
    let error = PostgresStore::open(&unreachable)
        .await
        .err()
        .expect("no server there")
        .to_string();
    assert!(error.contains("cannot connect"), "{error}");
    assert!(
        !error.contains("hunter2"),
        "the password must not appear in errors: {error}"
    );
}

/// Each runtime thread batches its advances on connections of its own; the statement's row lock
/// keeps one key's advances from several threads consistent (I1 under `strict`: the accepted
/// tokens form one increasing chain), and a closed store refuses on every thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batchers_on_several_threads_keep_one_keys_marks_consistent() {
    let schema = unique_schema();
    let store: Arc<dyn FenceStore> =
        Arc::new(PostgresStore::open(&config(&schema)).await.unwrap_or_else(|e| {
            panic!("PostgreSQL at {TEST_POSTGRES_URL} is required (scripts/ensure-services.sh starts it): {e}")
        }));
    support::contract::advances_from_many_tasks_form_one_chain(
        Arc::clone(&store),
        "shared",
        8,
        100,
    )
    .await;
    support::contract::closed_store_refuses_on_every_thread(store, "shared").await;
    drop_schema(&schema).await;
}

/// How the intents table was read so far, as the statistics system has it: scans of the index of
/// SUBMITTING intents, of the primary key, and sequential scans.
async fn intent_reads(connection: &mut sqlx::PgConnection, schema: &str) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT idx_scan FROM pg_stat_user_indexes \
                 WHERE schemaname = $1 AND indexrelname = 'intents_submitting_by_updated'), \
                (SELECT idx_scan FROM pg_stat_user_indexes \
                 WHERE schemaname = $1 AND indexrelname = 'intents_pkey'), \
                (SELECT seq_scan FROM pg_stat_user_tables \
                 WHERE schemaname = $1 AND relname = 'intents')",
    )
    .bind(schema)
    .fetch_one(connection)
    .await
    .expect("read table statistics")
}

/// Runs `setup` on a new store's schema (autovacuum off for `intents`), then records the outcomes
/// of the SUBMITTING intents `open-1` … `open-16` at once, and answers how the table was read
/// meanwhile: (before, after) of [`intent_reads`].
async fn record_outcomes_after(
    warm_up: &[&str],
    setup: &[&str],
) -> ((i64, i64, i64), (i64, i64, i64)) {
    use sqlx::Connection as _;
    let schema = unique_schema();
    let open = || async {
        PostgresStore::open(&config(&schema))
            .await
            .unwrap_or_else(|e| {
                panic!("PostgreSQL at {TEST_POSTGRES_URL} is required (scripts/ensure-services.sh starts it): {e}")
            })
    };
    // Opened once for its migrations and closed: their index builds count as sequential scans,
    // reported when the sessions end.
    open().await.close().await.expect("close");
    let mut connection = sqlx::PgConnection::connect(TEST_POSTGRES_URL)
        .await
        .expect("connect");
    let first = [
        format!("SET search_path = {schema}"),
        "ALTER TABLE intents SET (autovacuum_enabled = false)".to_owned(),
    ];
    for statement in first
        .iter()
        .map(String::as_str)
        .chain(warm_up.iter().copied())
    {
        sqlx::query(statement)
            .execute(&mut connection)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let store = open().await;
    let outcome = fencegate::store::StoredOutcome {
        status: 200,
        headers: Vec::new(),
        body: bytes::Bytes::from_static(b"ok"),
        body_complete: true,
    };
    if !warm_up.is_empty() {
        // Every session of the store plans the statement on the table as it is now (more than
        // five runs each, after which PostgreSQL may keep a generic plan).
        for round in 0..64 {
            let key = format!("warm-{round}");
            sqlx::query(
                "INSERT INTO intents VALUES ($1, 'payouts', 1, 'fp', 'SUBMITTING', 'a', 0, 0, 0, \
                 4000000000000, NULL)",
            )
            .bind(&key)
            .execute(&mut connection)
            .await
            .expect("insert a warm-up intent");
            let _ = store.complete(&key, outcome.clone(), 6_000_000).await;
        }
        // Until the store's sessions have reported those statements (within about ten seconds
        // of going idle), the counts move on their own.
        let mut last = intent_reads(&mut connection, &schema).await;
        let mut still = std::time::Instant::now();
        while still.elapsed() < std::time::Duration::from_secs(11) {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let now = intent_reads(&mut connection, &schema).await;
            if now != last {
                (last, still) = (now, std::time::Instant::now());
            }
        }
    }
    for statement in setup {
        sqlx::query(statement)
            .execute(&mut connection)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let before = intent_reads(&mut connection, &schema).await;
    let completed = futures_util::future::join_all(
        (1..=16).map(|n| store.complete(&format!("open-{n}"), outcome.clone(), 6_000_000)),
    )
    .await;
    // The store's sessions report their statistics within seconds of going idle: wait until
    // the key lookups show.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let after = loop {
        let now = intent_reads(&mut connection, &schema).await;
        if now.1 > before.1 || std::time::Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    store.close().await.expect("close");
    drop_schema(&schema).await;
    assert!(
        completed.iter().all(|c| matches!(c, Ok(true))),
        "every outcome recorded: {completed:?}"
    );
    assert!(
        after.1 > before.1,
        "the outcomes were recorded through the key's index (reads before, after: {before:?}, {after:?})"
    );
    (before, after)
}

const OPEN_INTENTS: &str = "INSERT INTO intents SELECT 'open-' || g, 'payouts', g, 'fp', \
     'SUBMITTING', 'a' || g, 0, 0, 0, 4000000000000, NULL FROM generate_series(1, 16) AS g";
const DONE_INTENTS: &str = "INSERT INTO intents SELECT 'done-' || g, 'payouts', g, 'fp', \
     'COMPLETED', NULL, 0, 0, 0, 4000000000000, '{}' FROM generate_series(1, 20000) AS g";

/// A table that a planner reads whole rather than look 16 keys up in it one by one.
const SOME_DONE_INTENTS: &str = "INSERT INTO intents SELECT 'done-' || g, 'payouts', g, 'fp', \
     'COMPLETED', NULL, 0, 0, 0, 4000000000000, '{}' FROM generate_series(1, 1000) AS g";

/// Recording outcomes finds each intent by its key. The index of SUBMITTING intents (for
/// reconciliation) keeps an entry for every intent that was SUBMITTING until a vacuum, and the
/// planner, whose statistics count few SUBMITTING intents, chose it for the batched completion:
/// each batch then read every intent completed since the last vacuum.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recording_outcomes_does_not_scan_the_submitting_intents() {
    let (before, after) = record_outcomes_after(&[], &[
        DONE_INTENTS,
        OPEN_INTENTS,
        "ANALYZE intents",
        // 5,000 more that went SUBMITTING -> COMPLETED since, without a vacuum.
        "INSERT INTO intents SELECT 'churn-' || g, 'payouts', g, 'fp', 'SUBMITTING', 'a', 0, 0, \
         0, 4000000000000, NULL FROM generate_series(1, 5000) AS g",
        "UPDATE intents SET state = 'COMPLETED', outcome = '{}', attempt = NULL \
         WHERE key LIKE 'churn-%'",
    ])
    .await;
    assert_eq!(
        after.0, before.0,
        "recording outcomes scanned the index of SUBMITTING intents"
    );
}

/// The same on a table that grew since its statistics were taken and since the statement was
/// planned (a new store, or any between two automatic analyses): each session kept the plan it
/// made for the small table and read all of the table per batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recording_outcomes_does_not_read_the_whole_table() {
    let (before, after) =
        record_outcomes_after(&[OPEN_INTENTS, "ANALYZE intents"], &[SOME_DONE_INTENTS]).await;
    assert_eq!(
        after.2, before.2,
        "recording outcomes read the intents table sequentially ({before:?} -> {after:?})"
    );
}
