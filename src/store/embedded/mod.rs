//! The embedded backend: one SQLite file in WAL mode with `synchronous = FULL`, owned by a single
//! writer that commits every batch of concurrent advances with one statement and one fsync.
//!
//! Group commit needs no timer: while one commit is syncing, new requests queue and the next batch
//! takes all of them, so a lone request never waits for company. The batches run on the serving
//! thread that found the writer idle (`plumbing/combining.rs`), not on a writer task of their own.
//! The file is opened with `locking_mode = EXCLUSIVE`, so a second process cannot open the same
//! store by mistake.
//! Intent records (`intents.rs`) go through the same writer, one transaction per batch.

mod intent_batch;
mod intents;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteLockingMode, SqliteSynchronous,
};
use sqlx::{ConnectOptions as _, Connection as _, QueryBuilder, Sqlite};
use tokio::sync::oneshot;

use crate::config::Compare;
use crate::store::guard::expected::{mismatch_reason, ExpectedIdentity};
use crate::store::intents::{
    BeginRequest, Begun, IntentRecord, IntentStore, Resolution, StoredOutcome,
};
use crate::store::plumbing::combining::{BatchWriter, Combiner};
use crate::store::{
    decide, new_store_id, Advance, AdvancedAndBegun, FenceStore, StoreError, StoreFuture,
    StoreIdentity,
};
use intents::IntentCommand;

/// The backend's name in errors, logs and metrics.
const BACKEND: &str = "embedded";
/// Most commands per writer batch, whatever `max_batch` says: a batch binds up to three SQL
/// parameters per advance, and SQLite allows 32,766 per statement.
const MAX_BATCH: usize = 8000;
/// How long opening waits for a file another process holds before failing with a clear error.
const OPEN_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fence_marks (
    key  TEXT    PRIMARY KEY NOT NULL,
    mark INTEGER NOT NULL  -- the u64 mark, stored bit for bit as SQLite's signed 64-bit integer
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencegate_meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) WITHOUT ROWID;
";

/// Handle to the writer; cheap to share behind an `Arc`. Every caller awaits its own answer, so
/// the queue in front of the writer holds at most one command per request in flight.
pub struct EmbeddedStore {
    commands: Combiner<Writer>,
    expected: Arc<ExpectedIdentity>,
}

enum Command {
    Advance {
        key: String,
        token: u64,
        compare: Compare,
        reply: oneshot::Sender<Result<Advance, StoreError>>,
        /// An intent to begin in the same batch if the token is accepted (dropped otherwise).
        then_begin: Option<IntentCommand>,
    },
    Current {
        key: String,
        reply: oneshot::Sender<Result<Option<u64>, StoreError>>,
    },
    Identity {
        reply: oneshot::Sender<Result<StoreIdentity, StoreError>>,
    },
    Intent(IntentCommand),
    Close {
        reply: oneshot::Sender<()>,
    },
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
        sqlx::raw_sql(intents::SCHEMA)
            .execute(&mut connection)
            .await
            .map_err(open_error)?;
        let expected = Arc::new(ExpectedIdentity::default());
        let writer = Writer {
            connection: Some(connection),
            path: path.to_owned(),
            expected: Arc::clone(&expected),
        };
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

    /// One command: the writer begins the intent, in the intents' transaction of the same batch,
    /// only after it accepted the advance.
    fn advance_and_begin(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
        begin: BeginRequest,
    ) -> Result<StoreFuture<'_, AdvancedAndBegun>, Box<BeginRequest>> {
        let key = key.to_owned();
        Ok(Box::pin(async move {
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

/// The single owner of the SQLite connection; `None` once the store is closed.
struct Writer {
    connection: Option<SqliteConnection>,
    path: PathBuf,
    /// Compared by every batch's marks statement.
    expected: Arc<ExpectedIdentity>,
}

impl BatchWriter for Writer {
    type Command = Command;

    fn process<'a>(&'a mut self, batch: &'a mut Vec<Command>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(connection) = self.connection.as_mut() else {
                for command in batch.drain(..) {
                    if let Some(close) = fail(command, || StoreError::Closed) {
                        let _ = close.send(());
                    }
                }
                return;
            };
            let expected = self.expected.get();
            if let Some(close) = process(connection, &self.path, batch, expected.as_deref()).await {
                if let Some(connection) = self.connection.take() {
                    if let Err(e) = connection.close().await {
                        tracing::warn!(path = %self.path.display(), error = %e, "closing the embedded store failed");
                    }
                }
                let _ = close.send(());
            }
        })
    }
}

/// Answers every command of `batch` (draining it); returns the reply of a close request.
async fn process(
    connection: &mut SqliteConnection,
    path: &Path,
    batch: &mut Vec<Command>,
    expected: Option<&str>,
) -> Option<oneshot::Sender<()>> {
    let keys: Vec<&str> = batch
        .iter()
        .filter_map(|c| match c {
            Command::Advance { key, .. } | Command::Current { key, .. } => Some(key.as_str()),
            Command::Identity { .. } | Command::Intent(_) | Command::Close { .. } => None,
        })
        .collect();
    // The highest token asked per key: raised, where above the stored mark, by the same call
    // that reads the marks (see `read_and_raise`).
    let mut highest: HashMap<&str, u64> = HashMap::new();
    for command in batch.iter() {
        if let Command::Advance { key, token, .. } = command {
            let entry = highest.entry(key.as_str()).or_insert(*token);
            *entry = (*entry).max(*token);
        }
    }
    let loaded = match read_and_raise(connection, &keys, &highest, expected).await {
        Ok(Some(marks)) => marks,
        Ok(None) => {
            let reason = mismatch_reason(expected.unwrap_or_default(), None);
            let error = || StoreError::Untrusted {
                reason: reason.clone(),
            };
            let mut close = None;
            for command in batch.drain(..) {
                close = match command {
                    // The identity is what is in doubt: it is still answered.
                    Command::Identity { reply } => {
                        let identity = identity(connection)
                            .await
                            .map_err(|source| backend_error(&Arc::new(source)));
                        let _ = reply.send(identity);
                        close
                    }
                    other => fail(other, error).or(close),
                };
            }
            return close;
        }
        Err(source) => {
            tracing::error!(path = %path.display(), error = %source, "embedded store read failed");
            let source = Arc::new(source);
            let error = || backend_error(&source);
            let mut close = None;
            for command in batch.drain(..) {
                close = fail(command, error).or(close);
            }
            return close;
        }
    };
    let mut marks: HashMap<String, u64> = loaded;
    let mut answers = Vec::with_capacity(batch.len());
    let mut intents = Vec::new();
    let mut close = None;
    for command in batch.drain(..) {
        match command {
            Command::Advance {
                key,
                token,
                compare,
                reply,
                then_begin,
            } => {
                let outcome = decide(marks.get(&key).copied(), token, compare);
                if let Advance::Accepted { previous } = outcome {
                    if previous.is_none_or(|p| token > p) {
                        marks.insert(key, token);
                    }
                    // Applied after the marks' commit below, like every intent of the batch.
                    intents.extend(then_begin);
                }
                answers.push((outcome, reply));
            }
            Command::Current { key, reply } => {
                let _ = reply.send(Ok(marks.get(&key).copied()));
            }
            Command::Identity { reply } => {
                let identity = identity(connection)
                    .await
                    .map_err(|source| backend_error(&Arc::new(source)));
                let _ = reply.send(identity);
            }
            Command::Intent(command) => intents.push(command),
            Command::Close { reply } => close = Some(reply),
        }
    }
    // The raised marks were committed by `read_and_raise`, before any answer is sent (I2).
    for (outcome, reply) in answers {
        let _ = reply.send(Ok(outcome));
    }
    // After the marks, so that intents in a batch do not delay its fence advances.
    intents::apply(connection, intents).await;
    close
}

/// Reads the marks of `keys`, then raises each key in `highest` to its token where that is above
/// the stored mark: two statements, one call to sqlx's worker thread. The read runs first, so it
/// returns the marks from before the raise, against which the writer then decides every advance
/// in arrival order. That is consistent with what the raise wrote: in arrival order, a key's
/// highest token is accepted exactly when it is above the stored mark (an equal or lower one
/// before it cannot refuse it), so the mark ends at max(stored, highest) either way.
///
/// Outside an explicit transaction SQLite commits (and, with `synchronous = FULL`, fsyncs) the
/// raise as one atomic statement. The `WHERE` guard (an unsigned comparison of the stored bit
/// patterns) keeps I3 even if the file was changed behind the writer's back.
///
/// With `expected`, the adopted store's id, the raise happens only if the file's identity record
/// holds it (in the raise's own statement), and the read says whether it does: `Ok(None)` for a
/// file that is not the adopted store.
async fn read_and_raise(
    connection: &mut SqliteConnection,
    keys: &[&str],
    highest: &HashMap<&str, u64>,
    expected: Option<&str>,
) -> Result<Option<HashMap<String, u64>>, sqlx::Error> {
    if keys.is_empty() {
        return Ok(Some(HashMap::new()));
    }
    let mut query = QueryBuilder::<Sqlite>::new("SELECT key, mark FROM fence_marks WHERE key IN (");
    let mut list = query.separated(", ");
    for key in keys {
        list.push_bind(*key);
    }
    query.push(")");
    if let Some(expected) = expected {
        // One row with no key: the identity record is not the adopted store's.
        query.push(" UNION ALL SELECT NULL, NULL WHERE NOT EXISTS (SELECT 1 FROM fencegate_meta WHERE name = 'store_id' AND value = ");
        query.push_bind(expected);
        query.push(")");
    }
    if !highest.is_empty() {
        query.push("; INSERT INTO fence_marks (key, mark) SELECT column1, column2 FROM (");
        query.push_values(highest, |mut row, (key, mark)| {
            row.push_bind(*key).push_bind(encode_mark(*mark));
        });
        query.push(") WHERE ");
        match expected {
            Some(expected) => {
                query.push(
                    "EXISTS (SELECT 1 FROM fencegate_meta WHERE name = 'store_id' AND value = ",
                );
                query.push_bind(expected);
                query.push(")");
            }
            None => {
                query.push("true");
            }
        }
        query.push(
            " ON CONFLICT (key) DO UPDATE SET mark = excluded.mark WHERE \
             CASE WHEN (excluded.mark < 0) = (fence_marks.mark < 0) \
                  THEN excluded.mark > fence_marks.mark \
                  ELSE excluded.mark < 0 END",
        );
    }
    let rows: Vec<(Option<String>, Option<i64>)> =
        query.build_query_as().fetch_all(connection).await?;
    let mut marks = HashMap::with_capacity(rows.len());
    for row in rows {
        match row {
            (Some(key), Some(mark)) => {
                marks.insert(key, decode_mark(mark));
            }
            _ => return Ok(None),
        }
    }
    Ok(Some(marks))
}

/// Reads the store's id, writing a new one when there is none.
async fn identity(connection: &mut SqliteConnection) -> Result<StoreIdentity, sqlx::Error> {
    let fresh = new_store_id();
    let inserted = sqlx::query("INSERT INTO fencegate_meta (name, value) VALUES ('store_id', ?) ON CONFLICT (name) DO NOTHING")
        .bind(&fresh)
        .execute(&mut *connection)
        .await?
        .rows_affected();
    let (id,): (String,) =
        sqlx::query_as("SELECT value FROM fencegate_meta WHERE name = 'store_id'")
            .fetch_one(connection)
            .await?;
    Ok(StoreIdentity {
        id,
        created: inserted == 1,
    })
}

/// SQLite integers are signed 64-bit: marks are stored bit for bit (`u64::MAX` reads back as -1).
fn encode_mark(mark: u64) -> i64 {
    i64::from_ne_bytes(mark.to_ne_bytes())
}

fn decode_mark(stored: i64) -> u64 {
    u64::from_ne_bytes(stored.to_ne_bytes())
}

fn backend_error(source: &Arc<sqlx::Error>) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::clone(source) as Arc<dyn std::error::Error + Send + Sync>,
    }
}

/// Answers `command` with `error()`; a close request is handed back to the caller instead.
fn fail(command: Command, error: impl Fn() -> StoreError) -> Option<oneshot::Sender<()>> {
    match command {
        Command::Advance { reply, .. } => {
            let _ = reply.send(Err(error()));
        }
        Command::Current { reply, .. } => {
            let _ = reply.send(Err(error()));
        }
        Command::Identity { reply } => {
            let _ = reply.send(Err(error()));
        }
        Command::Intent(command) => command.fail(error()),
        Command::Close { reply } => return Some(reply),
    }
    None
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
