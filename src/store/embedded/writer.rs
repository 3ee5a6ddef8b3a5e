//! The embedded store's writer, the single owner of the SQLite connection: each batch of commands
//! reads and raises the marks it names in one call, then runs the batch's intent commands
//! (`intents.rs`), both in one commit when the batch has both (group commit), and answers each
//! command only once what it reports is committed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection as _, QueryBuilder, Sqlite};
use tokio::sync::oneshot;

use super::commands::{fail, Command, Reply};
use super::intent_batch::Settled;
use super::schema::{decode_mark, encode_mark};
use super::{backend_error, intents};
use crate::store::expected::{mismatch_reason, ExpectedIdentity};
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
/// Runs one batch. A batch that raises marks and writes intents does both in one transaction,
/// so they share one commit (one fsync): a write's advance-and-begin and another write's outcome
/// go to disk together, and every answer waits for that commit. Any other batch commits its
/// marks first and answers the advances before it writes its intents, so that intents do not
/// delay fence advances.
async fn process(
    connection: &mut SqliteConnection,
    path: &Path,
    batch: &mut Vec<Command>,
    expected: Option<&str>,
) -> Option<oneshot::Sender<()>> {
    if !raises_marks_and_writes_intents(batch) {
        return match decide_and_write(connection, path, batch, expected, Answers::AsWritten).await {
            Ok((held, close)) => {
                held.send();
                close
            }
            Err(close) => close,
        };
    }
    let mut transaction = match connection.begin().await {
        Ok(transaction) => transaction,
        Err(source) => return fail_batch(path, batch, source),
    };
    match decide_and_write(&mut transaction, path, batch, expected, Answers::AtCommit).await {
        Ok((held, close)) => {
            match transaction.commit().await {
                Ok(()) => held.send(),
                Err(source) => {
                    tracing::error!(path = %path.display(), error = %source, "embedded store commit failed");
                    held.fail(&Arc::new(source));
                }
            }
            close
        }
        Err(close) => {
            if let Err(e) = transaction.rollback().await {
                tracing::warn!(path = %path.display(), error = %e, "rolling back an embedded batch failed");
            }
            close
        }
    }
}

/// Whether `batch` both raises marks and writes intents (and holds nothing that must answer on
/// its own: an identity read, a close).
fn raises_marks_and_writes_intents(batch: &[Command]) -> bool {
    let mut advances = false;
    let mut intents = false;
    for command in batch {
        match command {
            Command::Advance { then_begin, .. } => {
                advances = true;
                intents |= then_begin.is_some();
            }
            Command::Intent(_) => intents = true,
            Command::Current { .. } => {}
            Command::Identity { .. } | Command::Close { .. } => return false,
        }
    }
    advances && intents
}

/// When a batch's answers go out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answers {
    /// Each as soon as what it reports is committed: the marks by their own statement, the
    /// intents by theirs.
    AsWritten,
    /// All after the caller's transaction commits.
    AtCommit,
}

/// Answers held for the commit of the transaction that wrote them.
#[derive(Default)]
struct Held {
    advances: Vec<(Advance, Reply<Advance>)>,
    currents: Vec<(Option<u64>, Reply<Option<u64>>)>,
    intents: Settled,
}

impl Held {
    fn send(self) {
        for (outcome, reply) in self.advances {
            let _ = reply.send(Ok(outcome));
        }
        for (mark, reply) in self.currents {
            let _ = reply.send(Ok(mark));
        }
        self.intents.send();
    }

    fn fail(self, source: &Arc<sqlx::Error>) {
        for (_, reply) in self.advances {
            let _ = reply.send(Err(backend_error(source)));
        }
        for (_, reply) in self.currents {
            let _ = reply.send(Err(backend_error(source)));
        }
        self.intents.fail(source);
    }
}

/// Fails every command of `batch` (draining it) with `source`; returns the reply of a close
/// request.
fn fail_batch(
    path: &Path,
    batch: &mut Vec<Command>,
    source: sqlx::Error,
) -> Option<oneshot::Sender<()>> {
    tracing::error!(path = %path.display(), error = %source, "embedded store write failed");
    let source = Arc::new(source);
    let error = || backend_error(&source);
    let mut close = None;
    for command in batch.drain(..) {
        close = fail(command, error).or(close);
    }
    close
}

/// Decides and writes every command of `batch` (draining it). With [`Answers::AsWritten`] every
/// answer is sent here; with [`Answers::AtCommit`] those of writes that succeeded are handed
/// back. `Err`: nothing was written and every command was answered with the error (the caller
/// rolls its transaction back). Either way the reply of a close request comes back.
async fn decide_and_write(
    connection: &mut SqliteConnection,
    path: &Path,
    batch: &mut Vec<Command>,
    expected: Option<&str>,
    answers: Answers,
) -> Result<(Held, Option<oneshot::Sender<()>>), Option<oneshot::Sender<()>>> {
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
            return Err(close);
        }
        Err(source) => return Err(fail_batch(path, batch, source)),
    };
    let mut marks: HashMap<String, u64> = loaded;
    let mut held = Held::default();
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
                    // Applied after the marks below, like every intent of the batch.
                    intents.extend(then_begin);
                }
                held.advances.push((outcome, reply));
            }
            Command::Current { key, reply } => {
                held.currents.push((marks.get(&key).copied(), reply));
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
    if answers == Answers::AsWritten {
        // The raised marks were committed by `read_and_raise`, before any answer is sent (I2).
        std::mem::take(&mut held).send();
        // After the marks, so that intents in a batch do not delay its fence advances.
        intents::apply(connection, intents).await.send();
    } else {
        held.intents = intents::apply(connection, intents).await;
    }
    Ok((held, close))
}

/// Reads the marks of `keys`, then raises each key in `highest` to its token where that is above
/// the stored mark: two statements, one call to sqlx's worker thread. The read runs first, so it
/// returns the marks from before the raise, against which the writer then decides every advance
/// in arrival order. That is consistent with what the raise wrote: in arrival order, a key's
/// highest token is accepted exactly when it is above the stored mark (an equal or lower one
/// before it cannot refuse it), so the mark ends at max(stored, highest) either way.
///
/// Outside an explicit transaction SQLite commits (and, with `synchronous = FULL`, fsyncs) the
/// raise as one atomic statement; inside the writer's transaction the commit does. The `WHERE` guard (an unsigned comparison of the stored bit
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use sqlx::ConnectOptions as _;

    use super::super::commands::IntentCommand;
    use super::super::schema::{INTENTS_SCHEMA, SCHEMA};
    use super::*;
    use crate::config::Compare;
    use crate::store::intents::{BeginRequest, Begun, StoredOutcome};

    async fn connection() -> SqliteConnection {
        let mut connection = "sqlite::memory:"
            .parse::<sqlx::sqlite::SqliteConnectOptions>()
            .expect("options")
            .connect()
            .await
            .expect("in-memory database");
        sqlx::raw_sql(SCHEMA)
            .execute(&mut connection)
            .await
            .expect("schema");
        sqlx::raw_sql(INTENTS_SCHEMA)
            .execute(&mut connection)
            .await
            .expect("intents schema");
        connection
    }

    fn begin(key: &str) -> BeginRequest {
        BeginRequest {
            key: key.to_owned(),
            route: "payouts".to_owned(),
            fence: 5,
            fingerprint: "fp".to_owned(),
            attempt: format!("attempt-{key}"),
            attempt_expires_ms: 2_000,
            now_ms: 1_000,
            expires_ms: 60_000,
        }
    }

    type Answers = (
        oneshot::Receiver<Result<Advance, StoreError>>,
        oneshot::Receiver<Result<Begun, StoreError>>,
        oneshot::Receiver<Result<bool, StoreError>>,
    );

    /// One write's advance-and-begin beside another write's outcome, as a pipelined batch holds.
    fn advance_begin_and_outcome(
        key: &str,
        intent: &str,
        finished: &str,
    ) -> (Vec<Command>, Answers) {
        let (advanced, advance_answer) = oneshot::channel();
        let (begun, begin_answer) = oneshot::channel();
        let (completed, complete_answer) = oneshot::channel();
        let batch = vec![
            Command::Advance {
                key: key.to_owned(),
                token: 5,
                compare: Compare::Strict,
                reply: advanced,
                then_begin: Some(IntentCommand::Begin {
                    request: begin(intent),
                    reply: begun,
                }),
            },
            Command::Intent(IntentCommand::Complete {
                key: finished.to_owned(),
                outcome: StoredOutcome {
                    status: 201,
                    headers: Vec::new(),
                    body: Default::default(),
                    body_complete: true,
                },
                now_ms: 1_500,
                reply: completed,
            }),
        ];
        (batch, (advance_answer, begin_answer, complete_answer))
    }

    /// Counts commits, runs `at_commit` at each, and turns them into rollbacks while `refuse` is
    /// set.
    async fn count_commits(
        connection: &mut SqliteConnection,
        refuse: Arc<AtomicBool>,
        mut at_commit: impl FnMut() + Send + 'static,
    ) -> Arc<AtomicUsize> {
        let commits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&commits);
        connection
            .lock_handle()
            .await
            .expect("handle")
            .set_commit_hook(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                at_commit();
                !refuse.load(Ordering::SeqCst)
            });
        commits
    }

    async fn seed_submitting(connection: &mut SqliteConnection, key: &str) {
        let (begun, answer) = oneshot::channel();
        let mut batch = vec![Command::Intent(IntentCommand::Begin {
            request: begin(key),
            reply: begun,
        })];
        assert!(process(connection, Path::new("test"), &mut batch, None)
            .await
            .is_none());
        assert_eq!(
            answer.await.expect("answered").expect("begun"),
            Begun::Fresh
        );
    }

    /// A batch with a mark to raise and intents to write commits once (the group commit), and
    /// every answer is sent only after that commit.
    #[tokio::test]
    async fn marks_and_intents_of_a_batch_share_one_commit() {
        let mut connection = connection().await;
        seed_submitting(&mut connection, "earlier").await;
        let (mut batch, (advance, begin, complete)) =
            advance_begin_and_outcome("k", "later", "earlier");
        // At the commit, the hook sees whether the advance was answered before it.
        let advance = Arc::new(Mutex::new(advance));
        let early = Arc::new(AtomicBool::new(false));
        let at_commit = {
            let (advance, early) = (Arc::clone(&advance), Arc::clone(&early));
            move || {
                if let Ok(mut advance) = advance.lock() {
                    if !matches!(advance.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
                        early.store(true, Ordering::SeqCst);
                    }
                }
            }
        };
        let refuse = Arc::new(AtomicBool::new(false));
        let commits = count_commits(&mut connection, refuse, at_commit).await;
        assert!(
            process(&mut connection, Path::new("test"), &mut batch, None)
                .await
                .is_none()
        );
        assert_eq!(commits.load(Ordering::SeqCst), 1, "commits for one batch");
        assert!(
            !early.load(Ordering::SeqCst),
            "an answer went out before its commit"
        );
        let advance = advance.lock().expect("lock").try_recv().expect("answered");
        assert_eq!(
            advance.expect("advance"),
            Advance::Accepted { previous: None }
        );
        assert_eq!(begin.await.expect("answered").expect("begin"), Begun::Fresh);
        assert!(complete.await.expect("answered").expect("complete"));
    }

    /// When the shared commit fails, nothing of the batch is kept and every command is told so:
    /// neither the advance nor the begin is reported done.
    #[tokio::test]
    async fn a_failed_group_commit_fails_every_answer() {
        let mut connection = connection().await;
        seed_submitting(&mut connection, "earlier").await;
        let refuse = Arc::new(AtomicBool::new(true));
        let commits = count_commits(&mut connection, Arc::clone(&refuse), || {}).await;
        let (mut batch, (advance, begin, complete)) =
            advance_begin_and_outcome("k", "later", "earlier");
        assert!(
            process(&mut connection, Path::new("test"), &mut batch, None)
                .await
                .is_none()
        );
        assert_eq!(commits.load(Ordering::SeqCst), 1);
        assert!(advance.await.expect("answered").is_err());
        assert!(begin.await.expect("answered").is_err());
        assert!(complete.await.expect("answered").is_err());
        refuse.store(false, Ordering::SeqCst);
        let marks: Vec<(String,)> = sqlx::query_as("SELECT key FROM fence_marks")
            .fetch_all(&mut connection)
            .await
            .expect("marks");
        assert!(marks.is_empty(), "{marks:?}");
        let later: Vec<(String,)> = sqlx::query_as("SELECT key FROM intents WHERE key = 'later'")
            .fetch_all(&mut connection)
            .await
            .expect("intents");
        assert!(later.is_empty(), "{later:?}");
    }
}
