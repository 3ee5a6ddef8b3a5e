//! The embedded store's writer, the single owner of the SQLite connection: each batch of commands
//! reads and raises the marks it names in one call, answers the advances once that is committed,
//! then runs the batch's intent commands (`intents.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection as _, QueryBuilder, Sqlite};
use tokio::sync::oneshot;

use super::commands::{fail, Command};
use super::schema::{decode_mark, encode_mark};
use super::{backend_error, intents};
use crate::store::guard::expected::{mismatch_reason, ExpectedIdentity};
use crate::store::plumbing::combining::BatchWriter;
use crate::store::{decide, new_store_id, Advance, StoreError, StoreIdentity};

/// The single owner of the SQLite connection; `None` once the store is closed.
pub(super) struct Writer {
    connection: Option<SqliteConnection>,
    path: PathBuf,
    /// Compared by every batch's marks statement.
    expected: Arc<ExpectedIdentity>,
}

impl Writer {
    /// The writer of the store at `path`, owning its open `connection`.
    pub(super) fn new(
        connection: SqliteConnection,
        path: PathBuf,
        expected: Arc<ExpectedIdentity>,
    ) -> Writer {
        Writer {
            connection: Some(connection),
            path,
            expected,
        }
    }
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
