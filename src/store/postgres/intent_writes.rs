//! Batched intent writes on PostgreSQL: the fresh begins (insert when absent) and the outcome
//! records of every request a serving thread has in flight go together in one statement and one
//! commit, on connections taken from the store's pool. A begin whose key already has a record is
//! answered "not inserted" and takes the one-request transaction of `intents.rs`.

use std::collections::HashSet;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::{mpsc, oneshot};

use super::codec::encode_mark;
use super::fail_batch;
use crate::store::intents::IntentRecord;
use crate::store::plumbing::batches::{run_batches, QUEUE};
use crate::store::plumbing::intent_rows::encode_ms;
use crate::store::plumbing::mailbox::ask;
use crate::store::plumbing::per_thread::PerThread;
use crate::store::StoreError;

/// Fresh intents inserted unless their key has a record, and SUBMITTING intents completed, in
/// one statement. A fresh intent counts as inserted when the statement inserted it, or when the
/// record already holds its attempt: an advance whose answer was lost and which was repeated
/// (`advance.rs`) may have inserted it, and attempts are random, so only that attempt's own
/// insert can have written it.
///
/// The completion says `state <> 'COMPLETED'` (the only other state) rather than `state =
/// 'SUBMITTING'`: the latter matches the partial index of SUBMITTING intents, which keeps an
/// entry for every intent that was SUBMITTING since the last vacuum, and the planner, counting
/// few SUBMITTING intents, scanned all of it for every batch instead of looking each key up.
const WRITE_SQL: &str = "
WITH fresh AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[],
                         $6::bigint[], $7::bigint[], $8::bigint[])
        AS f(key, route, fence, fingerprint, attempt, attempt_expires_ms, now_ms, expires_ms)
), inserted AS (
    INSERT INTO intents (key, route, fence, fingerprint, state, attempt, attempt_expires_ms,
                         created_ms, updated_ms, expires_ms, outcome)
    SELECT key, route, fence, fingerprint, 'SUBMITTING', attempt, attempt_expires_ms,
           now_ms, now_ms, expires_ms, NULL
    FROM fresh ORDER BY key
    ON CONFLICT (key) DO NOTHING
    RETURNING key
), completed AS (
    UPDATE intents AS i
    SET state = 'COMPLETED', outcome = c.outcome, attempt = NULL, updated_ms = c.now_ms
    FROM unnest($9::text[], $10::text[], $11::bigint[]) AS c(key, outcome, now_ms)
    WHERE i.key = c.key AND i.state <> 'COMPLETED'
    RETURNING i.key
)
SELECT true AS begun, key FROM inserted
UNION ALL
SELECT true, i.key FROM intents AS i JOIN fresh AS f ON i.key = f.key AND i.attempt = f.attempt
UNION ALL
SELECT false, key FROM completed";

/// One intent write, answered on `reply` with whether it took effect.
pub(super) enum IntentWrite {
    /// Insert `record` (a fresh SUBMITTING intent) unless its key has a record.
    Insert {
        record: IntentRecord,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Complete `key`'s SUBMITTING intent with `outcome` (JSON).
    Complete {
        key: String,
        outcome: String,
        now_ms: u64,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
}

impl IntentWrite {
    fn key(&self) -> &str {
        match self {
            IntentWrite::Insert { record, .. } => &record.key,
            IntentWrite::Complete { key, .. } => key,
        }
    }

    fn is_insert(&self) -> bool {
        matches!(self, IntentWrite::Insert { .. })
    }

    fn into_reply(self) -> oneshot::Sender<Result<bool, StoreError>> {
        match self {
            IntentWrite::Insert { reply, .. } | IntentWrite::Complete { reply, .. } => reply,
        }
    }
}

/// Each serving thread's intent-write batcher.
pub(super) struct IntentWriters {
    writers: PerThread<mpsc::Sender<IntentWrite>>,
    pool: PgPool,
    max_batch: usize,
    in_flight: usize,
}

impl IntentWriters {
    pub(super) fn new(pool: PgPool, max_batch: usize, in_flight: usize) -> IntentWriters {
        IntentWriters {
            writers: PerThread::new(),
            pool,
            max_batch: max_batch.max(1),
            in_flight: in_flight.max(1),
        }
    }

    /// Queues `write` on the calling thread's batcher and waits for its answer.
    pub(super) async fn write(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<bool, StoreError>>) -> IntentWrite,
    ) -> Result<bool, StoreError> {
        let writer = self.writers.queue(|| {
            let (writer, writes) = mpsc::channel(QUEUE);
            tokio::spawn(run(
                self.pool.clone(),
                self.max_batch,
                self.in_flight,
                writes,
            ));
            writer
        })?;
        ask(&writer, make).await
    }

    /// Stops every batcher once its queue is answered; later writes fail with `Closed`.
    pub(super) fn close(&self) {
        drop(self.writers.close());
    }
}

/// One thread's batcher: up to `in_flight` statements at once, each on a connection taken from
/// the store's pool for the statement (and checked by the pool before it is handed out), so the
/// batchers hold no connection the store's other calls might wait for.
async fn run(
    pool: PgPool,
    max_batch: usize,
    in_flight: usize,
    writes: mpsc::Receiver<IntentWrite>,
) {
    run_batches(writes, max_batch, in_flight, |batch| {
        let pool = pool.clone();
        async move { run_batch(&pool, batch).await }
    })
    .await;
}

/// Runs `batch`: one write per key in each statement, a second write of a key in the next.
async fn run_batch(pool: &PgPool, mut batch: Vec<IntentWrite>) {
    while !batch.is_empty() {
        let (now, later) = one_per_key(batch);
        batch = later;
        let connection = match pool.acquire().await {
            Ok(connection) => connection,
            Err(source) => {
                fail_batch(
                    now.into_iter().chain(batch).map(IntentWrite::into_reply),
                    source,
                );
                return;
            }
        };
        match execute(connection, &now).await {
            Ok(done) => answer(now, &done),
            Err(source) => {
                tracing::error!(error = %source, "postgres intent write failed");
                fail_batch(now.into_iter().map(IntentWrite::into_reply), source);
            }
        }
    }
}

/// The first write of each key, and the rest (for a later statement: within one statement the
/// writes of a key would not see each other).
fn one_per_key(batch: Vec<IntentWrite>) -> (Vec<IntentWrite>, Vec<IntentWrite>) {
    let mut seen = HashSet::with_capacity(batch.len());
    batch
        .into_iter()
        .partition(|write| seen.insert(write.key().to_owned()))
}

/// The keys a statement inserted (or found holding their attempt) and completed.
#[derive(Default)]
struct Done {
    begun: HashSet<String>,
    completed: HashSet<String>,
}

/// Runs the statement for `batch`; a connection whose statement failed is closed, not pooled.
async fn execute(
    mut connection: PoolConnection<Postgres>,
    batch: &[IntentWrite],
) -> Result<Done, sqlx::Error> {
    let mut fresh = FreshColumns::default();
    let (mut keys, mut outcomes, mut times) = (Vec::new(), Vec::new(), Vec::new());
    for write in batch {
        match write {
            IntentWrite::Insert { record, .. } => fresh.push(record),
            IntentWrite::Complete {
                key,
                outcome,
                now_ms,
                ..
            } => {
                keys.push(key.as_str());
                outcomes.push(outcome.as_str());
                times.push(encode_ms(*now_ms));
            }
        }
    }
    let rows: Vec<(bool, String)> = match fresh
        .bind(sqlx::query_as(WRITE_SQL))
        .bind(&keys)
        .bind(&outcomes)
        .bind(&times)
        .fetch_all(&mut *connection)
        .await
    {
        Ok(rows) => rows,
        Err(source) => {
            // Not returned to the pool: its state after a failed statement is unknown.
            drop(connection.detach());
            return Err(source);
        }
    };
    let mut done = Done::default();
    for (begun, key) in rows {
        if begun {
            done.begun.insert(key);
        } else {
            done.completed.insert(key);
        }
    }
    Ok(done)
}

/// Answers each write of a statement that ran.
fn answer(batch: Vec<IntentWrite>, done: &Done) {
    for write in batch {
        let took = if write.is_insert() {
            done.begun.contains(write.key())
        } else {
            done.completed.contains(write.key())
        };
        let _ = write.into_reply().send(Ok(took));
    }
}

/// Fresh intents as statement arrays, column by column (`key, route, fence, fingerprint,
/// attempt, attempt_expires_ms, now_ms, expires_ms`): what `WRITE_SQL` and the advance's
/// statement (`advance.rs`) insert.
#[derive(Default)]
pub(super) struct FreshColumns<'a> {
    keys: Vec<&'a str>,
    routes: Vec<&'a str>,
    fences: Vec<i64>,
    fingerprints: Vec<&'a str>,
    attempts: Vec<Option<&'a str>>,
    attempt_expires: Vec<i64>,
    now: Vec<i64>,
    expires: Vec<i64>,
}

impl<'a> FreshColumns<'a> {
    pub(super) fn push(&mut self, record: &'a IntentRecord) {
        self.keys.push(&record.key);
        self.routes.push(&record.route);
        self.fences.push(encode_mark(record.fence));
        self.fingerprints.push(&record.fingerprint);
        self.attempts.push(record.attempt.as_deref());
        self.attempt_expires
            .push(encode_ms(record.attempt_expires_ms));
        self.now.push(encode_ms(record.created_ms));
        self.expires.push(encode_ms(record.expires_ms));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Binds the eight columns, in order, as the query's next parameters.
    pub(super) fn bind<'q, O>(
        &'q self,
        query: sqlx::query::QueryAs<'q, Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(&self.keys)
            .bind(&self.routes)
            .bind(&self.fences)
            .bind(&self.fingerprints)
            .bind(&self.attempts)
            .bind(&self.attempt_expires)
            .bind(&self.now)
            .bind(&self.expires)
    }
}
