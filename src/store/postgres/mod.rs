//! The PostgreSQL backend: marks shared by every gateway replica. Concurrent advances are batched
//! into one `INSERT … ON CONFLICT DO UPDATE` over arrays per round trip, per serving thread
//! (`thread_batchers.rs`); each key's check and write are one atomic step of that
//! statement, durable (synchronous_commit) when it returns.
//!
//! Within one batch a key appears once, with the largest token asked for it: the requests of a
//! batch were all in flight at once, so ordering them by token is a valid linearization, and the
//! statement's `previous_mark` tells where that order starts. Intent records live next to the
//! marks (`intents.rs`).

mod batcher;
mod intents;
mod reads;
mod thread_batchers;
mod turn_wants;
mod turns;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::ConnectOptions as _;
use tokio::sync::{mpsc, oneshot};

use crate::config::{Compare, PostgresStoreConfig};
use crate::store::guard::expected::{mismatch_reason, ExpectedIdentity};
use crate::store::plumbing::redact::redact_password;
use crate::store::{
    decide, new_store_id, Advance, FenceStore, StoreError, StoreFuture, StoreIdentity,
};
use reads::{read_marks, ReadRequest};
use thread_batchers::ThreadBatchers;
pub use turns::PostgresTurns;

/// The backend's name in errors, logs and metrics.
const BACKEND: &str = "postgres";
/// How long opening (and each later connection attempt) may take before it counts as a failure.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Advisory-lock key serializing schema creation among replicas ("fencegat" in ASCII).
const SCHEMA_LOCK_KEY: i64 = 0x6665_6e63_6567_6174;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The batched compare-and-advance: one row per key, the previous mark returned by the same
/// atomic update that raises it. With `$3`, the adopted store's id, nothing is advanced unless
/// the store's identity record holds it, and one row with `ok` false says so (a store wiped or
/// replaced since it was adopted).
const ADVANCE_SQL: &str = "
WITH ident AS (
    SELECT $3::text IS NULL OR EXISTS (
        SELECT 1 FROM fencegate_meta WHERE name = 'store_id' AND value = $3::text) AS ok
), advanced AS (
    INSERT INTO fence_marks AS m (key, mark, previous_mark)
    SELECT input.key, input.token, NULL
    FROM unnest($1::text[], $2::bigint[]) AS input(key, token), ident
    WHERE ident.ok
    ON CONFLICT (key) DO UPDATE
        SET previous_mark = m.mark, mark = GREATEST(m.mark, excluded.mark)
    RETURNING m.key, m.previous_mark
)
SELECT advanced.key, advanced.previous_mark, true AS ok FROM advanced
UNION ALL
SELECT NULL, NULL, false FROM ident WHERE NOT ident.ok";

pub struct PostgresStore {
    pub(super) pool: PgPool,
    advances: ThreadBatchers,
    reads: mpsc::Sender<ReadRequest>,
    expected: Arc<ExpectedIdentity>,
    /// For the key-turn sessions.
    options: PgConnectOptions,
}

pub(super) struct AdvanceRequest {
    key: String,
    token: u64,
    compare: Compare,
    pub(super) reply: oneshot::Sender<Result<Advance, StoreError>>,
}

impl PostgresStore {
    /// Connects, creates the schema and runs the migrations, and starts the batching task.
    pub async fn open(config: &PostgresStoreConfig) -> Result<PostgresStore, StoreError> {
        let options = connect_options(config)?;
        let pool = connect(config, options.clone()).await?;
        migrate_pool(&pool, &config.schema).await?;
        let in_flight = batches_in_flight(config);
        let expected = Arc::new(ExpectedIdentity::default());
        let advances = ThreadBatchers::new(
            options.clone(),
            config.max_batch,
            in_flight,
            Arc::clone(&expected),
        );
        let reads = batcher::start(
            pool.clone(),
            config.max_batch,
            in_flight,
            |pool, batch: Vec<ReadRequest>| Box::pin(read_marks(pool, batch)),
        );
        Ok(PostgresStore {
            pool,
            advances,
            reads,
            expected,
            options,
        })
    }

    /// The key turns of this store (for the ordering gate), taken under the name `holder` and
    /// comparing the same adopted identity.
    pub fn turns(&self, holder: &str) -> PostgresTurns {
        PostgresTurns::new(self.options.clone(), holder, Arc::clone(&self.expected))
    }
}

/// Batches run at once: as configured, at least one, at most one per pooled connection.
fn batches_in_flight(config: &PostgresStoreConfig) -> usize {
    let pool = usize::try_from(config.max_connections.max(1)).unwrap_or(usize::MAX);
    config.batches_in_flight.clamp(1, pool)
}

/// Creates the schema and applies pending migrations (what `fencegate migrate` runs).
pub async fn migrate(config: &PostgresStoreConfig) -> Result<(), StoreError> {
    let pool = connect(config, connect_options(config)?).await?;
    let result = migrate_pool(&pool, &config.schema).await;
    pool.close().await;
    result
}

/// The store's connection options: unqualified table names resolve to fencegate's schema.
fn connect_options(config: &PostgresStoreConfig) -> Result<PgConnectOptions, StoreError> {
    let options: PgConnectOptions = config.url.parse().map_err(|e| StoreError::Setup {
        backend: BACKEND,
        detail: format!(
            "{}: not a PostgreSQL URL: {e}",
            redact_password(&config.url)
        ),
    })?;
    Ok(options
        .options([("search_path", config.schema.as_str())])
        .log_statements(tracing::log::LevelFilter::Trace))
}

async fn connect(
    config: &PostgresStoreConfig,
    options: PgConnectOptions,
) -> Result<PgPool, StoreError> {
    let setup = |detail: String| StoreError::Setup {
        backend: BACKEND,
        detail,
    };
    let pool = PgPoolOptions::new()
        .max_connections(config.max_connections.max(1))
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|e| {
            setup(format!(
                "{}: cannot connect: {e}",
                redact_password(&config.url)
            ))
        })?;
    create_schema(&pool, &config.schema)
        .await
        .map_err(|e| setup(format!("cannot create schema {}: {e}", config.schema)))?;
    Ok(pool)
}

/// `CREATE SCHEMA IF NOT EXISTS`, under an advisory lock: replicas starting together would
/// otherwise race on the catalog's unique index. The schema is validated as a plain identifier
/// when the configuration loads.
async fn create_schema(pool: &PgPool, schema: &str) -> Result<(), sqlx::Error> {
    let mut connection = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SCHEMA_LOCK_KEY)
        .execute(&mut *connection)
        .await?;
    let created = sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .execute(&mut *connection)
        .await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(SCHEMA_LOCK_KEY)
        .execute(&mut *connection)
        .await?;
    created.map(|_| ())
}

async fn migrate_pool(pool: &PgPool, schema: &str) -> Result<(), StoreError> {
    MIGRATOR.run(pool).await.map_err(|e| StoreError::Setup {
        backend: BACKEND,
        detail: format!("migrating schema {schema}: {e}"),
    })
}

impl FenceStore for PostgresStore {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let request = AdvanceRequest {
                key,
                token,
                compare,
                reply,
            };
            self.advances.send(request).await?;
            answer.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>> {
        let key = key.to_owned();
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            self.reads
                .send(ReadRequest { key, reply })
                .await
                .map_err(|_| StoreError::Closed)?;
            answer.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        Box::pin(async move {
            let inserted = sqlx::query(
                "INSERT INTO fencegate_meta (name, value) VALUES ('store_id', $1) ON CONFLICT (name) DO NOTHING",
            )
            .bind(new_store_id())
            .execute(&self.pool)
            .await
            .map_err(backend_error)?
            .rows_affected();
            let (id,): (String,) =
                sqlx::query_as("SELECT value FROM fencegate_meta WHERE name = 'store_id'")
                    .fetch_one(&self.pool)
                    .await
                    .map_err(backend_error)?;
            Ok(StoreIdentity {
                id,
                created: inserted == 1,
            })
        })
    }

    fn expect_identity(&self, id: &str) {
        self.expected.set(id);
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            // Closing the pool makes the read batcher's pending and later batches fail with an
            // error; the advance batchers stop once their queues are answered.
            self.advances.close();
            self.pool.close().await;
            Ok(())
        })
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}

/// What became of a batch [`execute`] ran.
pub(super) enum Executed {
    /// Every request was answered; the connection is fine.
    Answered,
    /// The statement failed before any answer (nothing was answered): the batch is handed back,
    /// and the connection is in an unknown state.
    Failed {
        batch: Vec<AdvanceRequest>,
        source: sqlx::Error,
    },
}

/// Runs one batch of advances on `connection` and answers each of its requests. `repeated`: the
/// batch already failed once on another connection, whose statement may have run: a key whose
/// mark is now exactly the largest token asked for it may owe that to the lost attempt, so its
/// requests are answered with an error (outcome unknown), never as stale or as a fresh advance —
/// except that largest token under `monotonic`, which passes against its own mark either way.
pub(super) async fn execute(
    connection: &mut PgConnection,
    batch: Vec<AdvanceRequest>,
    expected: Option<&str>,
    repeated: bool,
) -> Executed {
    // One row per key, with the largest token; sorted so concurrent batches lock rows in one order.
    let mut largest: BTreeMap<String, u64> = BTreeMap::new();
    for request in &batch {
        let entry = largest.entry(request.key.clone()).or_insert(request.token);
        *entry = (*entry).max(request.token);
    }
    let keys: Vec<&str> = largest.keys().map(String::as_str).collect();
    let tokens: Vec<i64> = largest.values().map(|t| encode_mark(*t)).collect();
    let rows: Result<Vec<AdvanceRow>, sqlx::Error> = sqlx::query_as(ADVANCE_SQL)
        .bind(&keys)
        .bind(&tokens)
        .bind(expected)
        .fetch_all(connection)
        .await;
    let previous: BTreeMap<String, Option<u64>> = match rows {
        Ok(rows) if rows.iter().any(|(_, _, ok)| !ok) => {
            let reason = mismatch_reason(expected.unwrap_or_default(), None);
            for request in batch {
                let _ = request.reply.send(Err(StoreError::Untrusted {
                    reason: reason.clone(),
                }));
            }
            return Executed::Answered;
        }
        Ok(rows) => rows
            .into_iter()
            .filter_map(|(key, previous, _)| Some((key?, previous.map(decode_mark))))
            .collect(),
        Err(source) => return Executed::Failed { batch, source },
    };
    let batch = if repeated {
        let (unknown, known): (Vec<AdvanceRequest>, Vec<AdvanceRequest>) =
            batch.into_iter().partition(|request| {
                let largest = largest.get(&request.key).copied();
                let at_own_token = previous.get(&request.key).copied().flatten() == largest;
                // The largest monotonic token passes against its own mark either way.
                let passes_anyway =
                    Some(request.token) == largest && request.compare == Compare::Monotonic;
                at_own_token && !passes_anyway
            });
        for request in unknown {
            let _ = request.reply.send(Err(StoreError::Setup {
                backend: BACKEND,
                detail: format!(
                    "the answer to an advance of key {} was lost and its repeat found the key at its own token: whether the token was new is unknown",
                    request.key
                ),
            }));
        }
        known
    } else {
        batch
    };
    answer_in_token_order(batch, &previous);
    Executed::Answered
}

/// One row of [`ADVANCE_SQL`]: the key and the mark it replaced, or (`ok` false, the others
/// NULL) the store's refusal for not holding the adopted identity.
type AdvanceRow = (Option<String>, Option<i64>, bool);

/// Decides every request of a batch: per key, in ascending token order from the mark the
/// statement replaced.
fn answer_in_token_order(mut batch: Vec<AdvanceRequest>, previous: &BTreeMap<String, Option<u64>>) {
    batch.sort_by(|a, b| a.key.cmp(&b.key).then(a.token.cmp(&b.token)));
    let mut running: Option<(String, Option<u64>)> = None;
    for request in batch {
        let mark = match &running {
            Some((key, mark)) if *key == request.key => *mark,
            _ => match previous.get(&request.key) {
                Some(previous) => *previous,
                None => {
                    let _ = request.reply.send(Err(StoreError::Setup {
                        backend: BACKEND,
                        detail: format!(
                            "the advance statement returned no row for key {}",
                            request.key
                        ),
                    }));
                    continue;
                }
            },
        };
        let outcome = decide(mark, request.token, request.compare);
        let after = match outcome {
            Advance::Accepted { .. } => Some(mark.map_or(request.token, |m| m.max(request.token))),
            Advance::Stale { .. } => mark,
        };
        running = Some((request.key, after));
        let _ = request.reply.send(Ok(outcome));
    }
}

/// u64 → bigint with the top bit flipped: order-preserving, so SQL compares marks correctly.
pub(crate) fn encode_mark(mark: u64) -> i64 {
    i64::from_ne_bytes((mark ^ (1 << 63)).to_ne_bytes())
}

pub(crate) fn decode_mark(stored: i64) -> u64 {
    u64::from_ne_bytes(stored.to_ne_bytes()) ^ (1 << 63)
}

/// Answers every request of a failed batch with the batch's error.
pub(super) fn fail_batch<T>(
    replies: impl IntoIterator<Item = oneshot::Sender<Result<T, StoreError>>>,
    source: sqlx::Error,
) {
    let closed = matches!(source, sqlx::Error::PoolClosed);
    let source: Arc<dyn std::error::Error + Send + Sync> = Arc::new(source);
    for reply in replies {
        let _ = reply.send(Err(if closed {
            StoreError::Closed
        } else {
            StoreError::Backend {
                backend: BACKEND,
                source: Arc::clone(&source),
            }
        }));
    }
}

/// A failed statement as the store reports it: after `close` the pool refuses every call, which
/// the `FenceStore` contract calls `Closed`.
pub(super) fn backend_error(source: sqlx::Error) -> StoreError {
    match source {
        sqlx::Error::PoolClosed => StoreError::Closed,
        source => StoreError::Backend {
            backend: BACKEND,
            source: Arc::new(source),
        },
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn mark_encoding_preserves_order() {
        let marks = [
            0,
            1,
            9,
            1 << 53,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ];
        for pair in marks.windows(2) {
            assert!(encode_mark(pair[0]) < encode_mark(pair[1]), "{pair:?}");
        }
        for mark in marks {
            assert_eq!(decode_mark(encode_mark(mark)), mark);
        }
    }
}
