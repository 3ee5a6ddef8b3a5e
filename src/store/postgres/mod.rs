//! The PostgreSQL backend: marks shared by every gateway replica. This module owns the
//! `PostgresStore` handle, its opening and migrating, and the backend's name and errors.
//!
//! Concurrent advances are batched into one `INSERT … ON CONFLICT DO UPDATE` over arrays per round
//! trip (`advance.rs`), per serving thread (`thread_batchers.rs`); each key's check and write are
//! one atomic step of that statement, durable (synchronous_commit) when it returns. Within one
//! batch a key appears once, with the largest token asked for it: the requests of a batch were all
//! in flight at once, so ordering them by token is a valid linearization, and the statement's
//! `previous_mark` tells where that order starts.
//!
//! - `reads.rs`: batched mark reads; `intents.rs`: intent records, next to the marks.
//! - `turns.rs`, `turn_wants.rs`: key turns for the ordering gate.
//! - `schema.rs`: schema creation and migrations; `codec.rs`: how a mark is stored.

mod advance;
mod codec;
mod intent_writes;
mod intents;
mod known_rows;
mod reads;
mod schema;
mod thread_batchers;
mod tls;
mod turn_wants;
mod turns;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::ConnectOptions as _;
use tokio::sync::{mpsc, oneshot};

use crate::config::{Compare, PostgresStoreConfig};
use crate::store::expected::ExpectedIdentity;
use crate::store::intents::{decide_begin, BeginRequest, IntentStore as _};
use crate::store::plumbing::redact::redact_password;
use crate::store::{
    new_store_id, Advance, AdvanceAndBegin, AdvancedAndBegun, FenceStore, StoreError, StoreFuture,
    StoreIdentity,
};
use advance::AdvanceRequest;
use intent_writes::IntentWriters;
use reads::ReadRequest;
use schema::{create_schema, migrate_pool};
use thread_batchers::ThreadBatchers;
pub use turns::PostgresTurns;

/// The backend's name in errors, logs and metrics.
const BACKEND: &str = "postgres";
/// How long opening (and each later connection attempt) may take before it counts as a failure.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct PostgresStore {
    pool: PgPool,
    advances: ThreadBatchers,
    /// Fresh begins and outcome records, batched per serving thread.
    intent_writes: IntentWriters,
    reads: mpsc::Sender<ReadRequest>,
    expected: Arc<ExpectedIdentity>,
    /// For the key-turn sessions.
    options: PgConnectOptions,
}

impl PostgresStore {
    /// Connects, creates the schema and runs the migrations, and starts the batching task.
    pub async fn open(config: &PostgresStoreConfig) -> Result<PostgresStore, StoreError> {
        let options = connect_options(config)?;
        if tls::encrypts_without_verifying(&options) {
            tracing::warn!(
                url = %redact_password(&config.url),
                "postgres store: sslmode require encrypts but verifies nothing of the server; use verify-full with a ca_file"
            );
        }
        let pool = connect(config, options.clone()).await?;
        for migration in migrate_pool(&pool, &config.schema).await? {
            tracing::info!(schema = %config.schema, %migration, "postgres store: migration applied");
        }
        let in_flight = batches_in_flight(config);
        let expected = Arc::new(ExpectedIdentity::default());
        let advances = ThreadBatchers::new(
            options.clone(),
            config.max_batch,
            in_flight,
            Arc::clone(&expected),
        );
        let reads = reads::start(pool.clone(), config.max_batch, in_flight);
        let intent_writes = IntentWriters::new(pool.clone(), config.max_batch, in_flight);
        Ok(PostgresStore {
            pool,
            advances,
            intent_writes,
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

/// Creates the schema and applies pending migrations (what `fencegate migrate` runs); returns
/// the migrations it applied.
pub async fn migrate(config: &PostgresStoreConfig) -> Result<Vec<String>, StoreError> {
    let pool = connect(config, connect_options(config)?).await?;
    let result = migrate_pool(&pool, &config.schema).await;
    pool.close().await;
    result
}

/// The store's connection options: unqualified table names resolve to fencegate's schema, and
/// sequential scans are a last resort. Every statement of the store names its rows by key (the
/// batches as arrays of keys); on a table grown since its statistics were taken (a new store,
/// or between two automatic analyses) the planner read whole tables per batch instead, at a cost
/// that grew with the table (`tests/stores/store_contract_postgres.rs`,
/// `recording_outcomes_does_not_read_the_whole_table`). A statement with no index to use still
/// scans.
fn connect_options(config: &PostgresStoreConfig) -> Result<PgConnectOptions, StoreError> {
    let options: PgConnectOptions = config.url.parse().map_err(|e| StoreError::Setup {
        backend: BACKEND,
        detail: format!(
            "{}: not a PostgreSQL URL: {e}",
            redact_password(&config.url)
        ),
    })?;
    let options = tls::with_tls(options, config).map_err(|e| StoreError::Setup {
        backend: BACKEND,
        detail: format!("store.{}: {}", e.field, e.message),
    })?;
    Ok(options
        .options([
            ("search_path", config.schema.as_str()),
            ("enable_seqscan", "off"),
        ])
        .log_statements(tracing::log::LevelFilter::Trace))
}

/// Checks the store's TLS settings as opening it would, without connecting (`check-config`).
pub fn check_tls(config: &PostgresStoreConfig) -> Result<(), crate::tls::StoreTlsError> {
    let options: PgConnectOptions = config
        .url
        .parse()
        .map_err(|e| crate::tls::StoreTlsError::new("url", format!("not a PostgreSQL URL: {e}")))?;
    tls::with_tls(options, config).map(drop)
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

impl FenceStore for PostgresStore {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let request = AdvanceRequest {
                key,
                token,
                compare,
                then_begin: None,
                reply,
            };
            self.advances.send(request).await?;
            Ok(answer.await.map_err(|_| StoreError::Closed)??.advance)
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
            self.intent_writes.close();
            self.pool.close().await;
            Ok(())
        })
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}

impl AdvanceAndBegin for PostgresStore {
    /// The advance, carrying the fresh intent: the advance's statement inserts it when the key
    /// is alone in its batch and has no intent record. Otherwise, once the advance passed, the
    /// begin is made as `IntentStore::begin` makes it.
    fn advance_and_begin(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
        begin: BeginRequest,
    ) -> StoreFuture<'_, AdvancedAndBegun> {
        let key = key.to_owned();
        Box::pin(async move {
            let (fresh, then_begin) = decide_begin(None, &begin);
            let (reply, answer) = oneshot::channel();
            self.advances
                .send(AdvanceRequest {
                    key,
                    token,
                    compare,
                    then_begin,
                    reply,
                })
                .await?;
            let advanced = answer.await.map_err(|_| StoreError::Closed)??;
            let begun = match advanced.advance {
                Advance::Stale { .. } => None,
                Advance::Accepted { .. } if advanced.began => Some(Ok(fresh)),
                Advance::Accepted { .. } => Some(self.begin(begin).await),
            };
            Ok(AdvancedAndBegun {
                advance: advanced.advance,
                begun,
            })
        })
    }
}

/// Answers every request of a failed batch with the batch's error.
fn fail_batch<T>(
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
fn backend_error(source: sqlx::Error) -> StoreError {
    match source {
        sqlx::Error::PoolClosed => StoreError::Closed,
        source => StoreError::Backend {
            backend: BACKEND,
            source: Arc::new(source),
        },
    }
}
