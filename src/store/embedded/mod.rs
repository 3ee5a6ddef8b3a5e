//! The embedded backend: one SQLite file in WAL mode with `synchronous = FULL`, owned by a single
//! writer that commits every batch of concurrent advances with one statement and one fsync. This
//! module owns the `EmbeddedStore` handle, its opening, and the backend's name and errors.
//!
//! Group commit needs no timer: while one commit is syncing, new requests queue and the next batch
//! takes all of them, so a lone request never waits for company. The batches run on the serving
//! thread that found the writer idle (`plumbing/combining.rs`), not on a writer task of their own.
//! The file is opened with `locking_mode = EXCLUSIVE`, so a second process cannot open the same
//! store by mistake.
//! Intent records (`intents.rs`) go through the same writer, one transaction per batch.
//!
//! - `commands.rs`: what callers queue for the writer; `writer.rs`: the writer and its marks batch.
//! - `intents.rs`, `intent_batch.rs`: the intent commands of a batch; `schema.rs`: tables, codec.

mod commands;
mod intent_batch;
mod intents;
mod schema;
mod writer;

use std::path::Path;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteLockingMode, SqliteSynchronous};
use sqlx::ConnectOptions as _;
use tokio::sync::oneshot;

use crate::config::Compare;
use crate::store::expected::ExpectedIdentity;
use crate::store::intents::{
    BeginRequest, Begun, IntentCensus, IntentRecord, IntentStore, Resolution, StoredOutcome,
};
use crate::store::plumbing::combining::Combiner;
use crate::store::{
    Advance, AdvanceAndBegin, AdvancedAndBegun, FenceStore, StoreError, StoreFuture, StoreIdentity,
};
use commands::{Command, IntentCommand};
use schema::{INTENTS_SCHEMA, SCHEMA};
use writer::Writer;

/// The backend's name in errors, logs and metrics.
const BACKEND: &str = "embedded";
/// Most commands per writer batch, whatever `max_batch` says: a batch binds up to three SQL
/// parameters per advance, and SQLite allows 32,766 per statement.
const MAX_BATCH: usize = 8000;
/// How long opening waits for a file another process holds before failing with a clear error.
const OPEN_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

/// Handle to the writer; cheap to share behind an `Arc`. Every caller awaits its own answer, so
/// the queue in front of the writer holds at most one command per request in flight.
pub struct EmbeddedStore {
    commands: Combiner<Writer>,
    expected: Arc<ExpectedIdentity>,
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store at `path`.
    pub async fn open(path: &Path, max_batch: usize) -> Result<EmbeddedStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|source| StoreError::CreateDir {
                    path: path.to_owned(),
                    source,
                })?;
        }
        let open_error = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        let options = SqliteConnectOptions::from_str("sqlite:")
            .map_err(open_error)?
            .filename(path)
            .create_if_missing(true)
            .locking_mode(SqliteLockingMode::Exclusive)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(OPEN_BUSY_TIMEOUT);
        let mut connection = options.connect().await.map_err(open_error)?;
        sqlx::raw_sql(SCHEMA)
            .execute(&mut connection)
            .await
            .map_err(open_error)?;
        sqlx::raw_sql(INTENTS_SCHEMA)
            .execute(&mut connection)
            .await
            .map_err(open_error)?;
        let expected = Arc::new(ExpectedIdentity::default());
        let writer = Writer::new(connection, path.to_owned(), Arc::clone(&expected));
        Ok(EmbeddedStore {
            commands: Combiner::new(writer, max_batch.clamp(1, MAX_BATCH)),
            expected,
        })
    }

    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.commands.submit(make(reply));
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn intent<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> IntentCommand,
    ) -> Result<T, StoreError> {
        self.request(|reply| Command::Intent(make(reply))).await
    }
}

impl FenceStore for EmbeddedStore {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(self.request(move |reply| Command::Advance {
            key,
            token,
            compare,
            reply,
            then_begin: None,
        }))
    }

    fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>> {
        let key = key.to_owned();
        Box::pin(self.request(move |reply| Command::Current { key, reply }))
    }

    fn expect_identity(&self, id: &str) {
        self.expected.set(id);
    }

    fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        Box::pin(self.request(|reply| Command::Identity { reply }))
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let (reply, done) = oneshot::channel();
            self.commands.submit(Command::Close { reply });
            let _ = done.await;
            Ok(())
        })
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// The file is opened with an exclusive lock: no other process can write it.
    fn exclusive(&self) -> bool {
        true
    }
}

impl AdvanceAndBegin for EmbeddedStore {
    /// One command: the writer begins the intent, in the intents' transaction of the same batch,
    /// only after it accepted the advance.
    fn advance_and_begin(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
        begin: BeginRequest,
    ) -> StoreFuture<'_, AdvancedAndBegun> {
        let key = key.to_owned();
        Box::pin(async move {
            let (begin_reply, begun) = oneshot::channel();
            let then_begin = Some(IntentCommand::Begin {
                request: begin,
                reply: begin_reply,
            });
            let advance = self
                .request(move |reply| Command::Advance {
                    key,
                    token,
                    compare,
                    reply,
                    then_begin,
                })
                .await?;
            let begun = match advance {
                Advance::Accepted { .. } => Some(begun.await.unwrap_or(Err(StoreError::Closed))),
                Advance::Stale { .. } => None,
            };
            Ok(AdvancedAndBegun { advance, begun })
        })
    }
}

impl IntentStore for EmbeddedStore {
    fn begin(&self, request: BeginRequest) -> StoreFuture<'_, Begun> {
        Box::pin(self.intent(move |reply| IntentCommand::Begin { request, reply }))
    }

    fn complete(&self, key: &str, outcome: StoredOutcome, now_ms: u64) -> StoreFuture<'_, bool> {
        let key = key.to_owned();
        Box::pin(self.intent(move |reply| IntentCommand::Complete {
            key,
            outcome,
            now_ms,
            reply,
        }))
    }

    fn abandon(&self, key: &str, attempt: &str, now_ms: u64) -> StoreFuture<'_, ()> {
        let (key, attempt) = (key.to_owned(), attempt.to_owned());
        Box::pin(self.intent(move |reply| IntentCommand::Abandon {
            key,
            attempt,
            now_ms,
            reply,
        }))
    }

    fn get(&self, key: &str) -> StoreFuture<'_, Option<IntentRecord>> {
        let key = key.to_owned();
        Box::pin(self.intent(move |reply| IntentCommand::Get { key, reply }))
    }

    fn list_submitting(
        &self,
        updated_before_ms: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<IntentRecord>> {
        Box::pin(self.intent(move |reply| IntentCommand::ListSubmitting {
            updated_before_ms,
            limit,
            reply,
        }))
    }

    fn census(&self) -> StoreFuture<'_, IntentCensus> {
        Box::pin(self.intent(|reply| IntentCommand::Census { reply }))
    }

    fn resolve(&self, key: &str, resolution: Resolution, now_ms: u64) -> StoreFuture<'_, bool> {
        let key = key.to_owned();
        Box::pin(self.intent(move |reply| IntentCommand::Resolve {
            key,
            resolution,
            now_ms,
            reply,
        }))
    }

    fn prune(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, usize> {
        Box::pin(self.intent(move |reply| IntentCommand::Prune {
            now_ms,
            limit,
            reply,
        }))
    }
}

fn backend_error(source: &Arc<sqlx::Error>) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::clone(source) as Arc<dyn std::error::Error + Send + Sync>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_that_is_not_the_adopted_store_refuses_every_advance() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStore::open(&dir.path().join("marks.db"), 16)
            .await
            .expect("open");
        let identity = store.identity().await.expect("identity");
        store.expect_identity("another-store");
        let refused = store.advance("k", 1, Compare::Monotonic).await;
        assert!(
            matches!(refused, Err(StoreError::Untrusted { .. })),
            "{refused:?}"
        );
        store.expect_identity(&identity.id);
        assert_eq!(
            store.current("k").await.expect("read"),
            None,
            "the refused advance was made"
        );
        assert_eq!(
            store
                .advance("k", 1, Compare::Monotonic)
                .await
                .expect("advance"),
            Advance::Accepted { previous: None }
        );
        assert_eq!(store.current("k").await.expect("read"), Some(1));
    }
}
