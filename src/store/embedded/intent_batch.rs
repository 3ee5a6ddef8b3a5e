//! A run of single-key intent commands in the embedded store, done with one read and at most two
//! writes however many commands it holds: the keys' rows are read with one `SELECT … IN`, every
//! command is decided in order against those rows in memory, and the rows that changed are written
//! back with one `INSERT OR REPLACE` (and one `DELETE` for released intents). The writer task is
//! the file's only writer and runs this inside the batch's transaction, so this is the same as
//! running the commands one by one — without a round trip to sqlx's worker thread per command.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection as _, QueryBuilder, Sqlite};

use super::commands::IntentCommand;
use super::schema::{decode_fence, encode_fence};
use super::{backend_error, BACKEND};
use crate::store::intents::{decide_begin, IntentRecord, IntentState, Resolution, StoredOutcome};
use crate::store::plumbing::intent_rows::{encode_ms, CorruptIntent, IntentRow, COLUMNS};
use crate::store::StoreError;

/// Keys per `SELECT … IN` and rows per `INSERT`: far below SQLite's bound on bound parameters
/// (32,766; a row binds 11).
const CHUNK: usize = 500;

/// A key's record as this run sees it.
#[derive(Debug, Clone)]
enum Slot {
    Stored(Option<IntentRecord>),
    /// A row that does not decode: every command on it fails, and nothing is written for it.
    Corrupt(CorruptIntent),
}

/// What one command answers once the transaction's fate is known.
pub(super) type Answer = Box<dyn FnOnce(Option<StoreError>) + Send>;

/// The answers of commands whose writes succeeded, held until those writes are durable: the
/// writer sends them after the commit that holds them, or fails them when that commit fails.
#[must_use]
#[derive(Default)]
pub(super) struct Settled(Vec<Answer>);

impl Settled {
    pub(super) fn of(answers: Vec<Answer>) -> Settled {
        Settled(answers)
    }

    pub(super) fn send(self) {
        self.0.into_iter().for_each(|answer| answer(None));
    }

    pub(super) fn fail(self, source: &Arc<sqlx::Error>) {
        for answer in self.0 {
            answer(Some(backend_error(source)));
        }
    }
}

/// True for the commands a run can hold: those that read and write one key.
pub(super) fn is_single_key(command: &IntentCommand) -> bool {
    matches!(
        command,
        IntentCommand::Begin { .. }
            | IntentCommand::Complete { .. }
            | IntentCommand::Abandon { .. }
            | IntentCommand::Get { .. }
            | IntentCommand::Resolve { .. }
    )
}

/// Runs `run` (single-key commands only) and returns each command's answer, in order. On a SQL
/// error the whole batch is rolled back: the error and an answer for every command are returned.
pub(super) async fn apply_run(
    connection: &mut SqliteConnection,
    run: Vec<IntentCommand>,
) -> Result<Vec<Answer>, (sqlx::Error, Vec<Answer>)> {
    let (decided, answers) = decide_run(connection, run).await?;
    match decided.write(connection).await {
        Ok(()) => Ok(answers),
        Err(source) => Err((source, answers)),
    }
}

/// A batch of single-key commands only, outside any transaction the caller opened: when what it
/// changed fits one statement, that statement commits on its own (SQLite makes every statement
/// atomic, and the writer is the file's only user, so the read before it cannot go stale), which
/// saves the two round trips of `BEGIN` and `COMMIT`. Answers a failure at once; what succeeded
/// is answered by the caller (inside the writer's transaction, only once that commits).
pub(super) async fn apply_alone(
    connection: &mut SqliteConnection,
    run: Vec<IntentCommand>,
) -> Settled {
    let (decided, answers) = match decide_run(connection, run).await {
        Ok(decided) => decided,
        Err((source, answers)) => {
            fail_answers(answers, source);
            return Settled::default();
        }
    };
    let written = if decided.statements() <= 1 {
        decided.write(connection).await
    } else {
        write_in_transaction(connection, decided).await
    };
    match written {
        Ok(()) => Settled(answers),
        Err(source) => {
            fail_answers(answers, source);
            Settled::default()
        }
    }
}

async fn write_in_transaction(
    connection: &mut SqliteConnection,
    decided: RunState,
) -> Result<(), sqlx::Error> {
    let mut transaction = connection.begin().await?;
    decided.write(&mut transaction).await?;
    transaction.commit().await
}

fn fail_answers(answers: Vec<Answer>, source: sqlx::Error) {
    tracing::error!(error = %source, "embedded store intent write failed");
    let source = Arc::new(source);
    for answer in answers {
        answer(Some(backend_error(&source)));
    }
}

/// Reads the rows of `run`'s keys and decides every command in order; nothing is written yet.
async fn decide_run(
    connection: &mut SqliteConnection,
    run: Vec<IntentCommand>,
) -> Result<(RunState, Vec<Answer>), (sqlx::Error, Vec<Answer>)> {
    let keys: Vec<&str> = run.iter().filter_map(command_key).collect();
    let slots = match load(connection, &keys).await {
        Ok(slots) => slots,
        Err(source) => return Err((source, run.into_iter().map(unanswered).collect())),
    };
    let mut decided = RunState::new(slots);
    let answers = run.into_iter().map(|c| decided.decide(c)).collect();
    Ok((decided, answers))
}

/// The key a single-key command works on.
fn command_key(command: &IntentCommand) -> Option<&str> {
    match command {
        IntentCommand::Begin { request, .. } => Some(&request.key),
        IntentCommand::Complete { key, .. }
        | IntentCommand::Abandon { key, .. }
        | IntentCommand::Get { key, .. }
        | IntentCommand::Resolve { key, .. } => Some(key),
        IntentCommand::ListSubmitting { .. }
        | IntentCommand::Census { .. }
        | IntentCommand::Prune { .. } => None,
    }
}

/// An answer for a command that was never decided: it can only be told the batch's error.
fn unanswered(command: IntentCommand) -> Answer {
    Box::new(move |failure| command.fail(failure.unwrap_or(StoreError::Closed)))
}

/// Wraps a decided value: sent as is after a commit, replaced by the error after a rollback.
fn answer<T: Send + 'static>(
    reply: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
    value: Result<T, StoreError>,
) -> Answer {
    Box::new(move |failure| {
        let _ = reply.send(match failure {
            Some(error) => Err(error),
            None => value,
        });
    })
}

/// The rows of a run, and which of them the run changed.
struct RunState {
    slots: HashMap<String, Slot>,
    changed: HashSet<String>,
    released: HashSet<String>,
}

impl RunState {
    fn new(slots: HashMap<String, Slot>) -> RunState {
        RunState {
            slots,
            changed: HashSet::new(),
            released: HashSet::new(),
        }
    }

    /// The stored record of `key`, or the error of a corrupt one.
    fn record(&self, key: &str) -> Result<Option<&IntentRecord>, StoreError> {
        match self.slots.get(key) {
            None | Some(Slot::Stored(None)) => Ok(None),
            Some(Slot::Stored(Some(record))) => Ok(Some(record)),
            Some(Slot::Corrupt(corrupt)) => Err(corrupt_error(corrupt.clone())),
        }
    }

    fn store(&mut self, record: IntentRecord) {
        self.released.remove(&record.key);
        self.changed.insert(record.key.clone());
        self.slots
            .insert(record.key.clone(), Slot::Stored(Some(record)));
    }

    fn release(&mut self, key: &str) {
        self.changed.remove(key);
        self.released.insert(key.to_owned());
        self.slots.insert(key.to_owned(), Slot::Stored(None));
    }

    /// Decides one command against the rows as the commands before it left them.
    fn decide(&mut self, command: IntentCommand) -> Answer {
        match command {
            IntentCommand::Begin { request, reply } => match self.record(&request.key) {
                Ok(existing) => {
                    let (begun, write) = decide_begin(existing, &request);
                    if let Some(record) = write {
                        self.store(record);
                    }
                    answer(reply, Ok(begun))
                }
                Err(error) => answer(reply, Err(error)),
            },
            IntentCommand::Complete {
                key,
                outcome,
                now_ms,
                reply,
            } => answer(reply, self.complete(&key, outcome, now_ms)),
            IntentCommand::Abandon {
                key,
                attempt,
                now_ms,
                reply,
            } => answer(reply, self.abandon(&key, &attempt, now_ms)),
            IntentCommand::Get { key, reply } => {
                answer(reply, self.record(&key).map(|r| r.cloned()))
            }
            IntentCommand::Resolve {
                key,
                resolution,
                now_ms,
                reply,
            } => {
                let resolved = match resolution {
                    Resolution::Outcome(outcome) => self.complete(&key, outcome, now_ms),
                    Resolution::Release => self.release_submitting(&key),
                };
                answer(reply, resolved)
            }
            // Not single-key commands; the caller runs them on their own.
            other @ (IntentCommand::ListSubmitting { .. }
            | IntentCommand::Census { .. }
            | IntentCommand::Prune { .. }) => unanswered(other),
        }
    }

    /// A SUBMITTING intent becomes COMPLETED with `outcome`; false if there was none.
    fn complete(
        &mut self,
        key: &str,
        outcome: StoredOutcome,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let Some(record) = self.submitting(key)? else {
            return Ok(false);
        };
        let mut record = record.clone();
        record.state = IntentState::Completed;
        record.outcome = Some(outcome);
        record.attempt = None;
        record.updated_ms = now_ms;
        self.store(record);
        Ok(true)
    }

    /// Ends the lease of `attempt` on a SUBMITTING intent, if it still holds it.
    fn abandon(&mut self, key: &str, attempt: &str, now_ms: u64) -> Result<(), StoreError> {
        let Some(record) = self.submitting(key)? else {
            return Ok(());
        };
        if record.attempt.as_deref() != Some(attempt) {
            return Ok(());
        }
        let mut record = record.clone();
        record.attempt = None;
        record.attempt_expires_ms = now_ms;
        record.updated_ms = now_ms;
        self.store(record);
        Ok(())
    }

    /// Forgets a SUBMITTING intent; false if there was none.
    fn release_submitting(&mut self, key: &str) -> Result<bool, StoreError> {
        if self.submitting(key)?.is_none() {
            return Ok(false);
        }
        self.release(key);
        Ok(true)
    }

    fn submitting(&self, key: &str) -> Result<Option<&IntentRecord>, StoreError> {
        Ok(self
            .record(key)?
            .filter(|r| r.state == IntentState::Submitting))
    }

    /// How many statements `write` will run.
    fn statements(&self) -> usize {
        self.released.len().div_ceil(CHUNK) + self.changed.len().div_ceil(CHUNK)
    }

    /// Writes what the run changed: one `DELETE` per [`CHUNK`] released keys, one
    /// `INSERT OR REPLACE` per [`CHUNK`] changed rows.
    async fn write(self, connection: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        let released: Vec<&String> = self.released.iter().collect();
        for keys in released.chunks(CHUNK) {
            let mut query = QueryBuilder::<Sqlite>::new("DELETE FROM intents WHERE key IN (");
            let mut list = query.separated(", ");
            for key in keys {
                list.push_bind(key.as_str());
            }
            query.push(")");
            query.build().execute(&mut *connection).await?;
        }
        let changed: Vec<&IntentRecord> = self
            .changed
            .iter()
            .filter_map(|key| match self.slots.get(key) {
                Some(Slot::Stored(Some(record))) => Some(record),
                _ => None,
            })
            .collect();
        for records in changed.chunks(CHUNK) {
            let mut query =
                QueryBuilder::<Sqlite>::new(format!("INSERT OR REPLACE INTO intents ({COLUMNS}) "));
            query.push_values(records, |mut row, record| {
                row.push_bind(record.key.as_str())
                    .push_bind(record.route.as_str())
                    .push_bind(encode_fence(record.fence))
                    .push_bind(record.fingerprint.as_str())
                    .push_bind(record.state.as_str())
                    .push_bind(record.attempt.as_deref())
                    .push_bind(encode_ms(record.attempt_expires_ms))
                    .push_bind(encode_ms(record.created_ms))
                    .push_bind(encode_ms(record.updated_ms))
                    .push_bind(encode_ms(record.expires_ms))
                    .push_bind(record.outcome.as_ref().map(StoredOutcome::to_json));
            });
            query.build().execute(&mut *connection).await?;
        }
        Ok(())
    }
}

fn corrupt_error(corrupt: CorruptIntent) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::new(corrupt),
    }
}

/// Reads the rows of `keys` (each once), [`CHUNK`] keys per statement.
async fn load(
    connection: &mut SqliteConnection,
    keys: &[&str],
) -> Result<HashMap<String, Slot>, sqlx::Error> {
    let distinct: Vec<&str> = {
        let mut seen = HashSet::new();
        keys.iter().copied().filter(|k| seen.insert(*k)).collect()
    };
    let mut slots = HashMap::with_capacity(distinct.len());
    for keys in distinct.chunks(CHUNK) {
        let mut query =
            QueryBuilder::<Sqlite>::new(format!("SELECT {COLUMNS} FROM intents WHERE key IN ("));
        let mut list = query.separated(", ");
        for key in keys {
            list.push_bind(*key);
        }
        query.push(")");
        let rows: Vec<IntentRow> = query.build_query_as().fetch_all(&mut *connection).await?;
        for row in rows {
            let slot = match row.decode(decode_fence) {
                Ok(record) => Slot::Stored(Some(record)),
                Err(corrupt) => Slot::Corrupt(corrupt),
            };
            let key = match &slot {
                Slot::Stored(Some(record)) => record.key.clone(),
                Slot::Corrupt(corrupt) => corrupt.key.clone(),
                Slot::Stored(None) => continue,
            };
            slots.insert(key, slot);
        }
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use sqlx::ConnectOptions as _;
    use tokio::sync::oneshot;

    use super::*;
    use crate::store::intents::{BeginRequest, Begun};

    async fn memory_store() -> SqliteConnection {
        let mut connection = "sqlite::memory:"
            .parse::<sqlx::sqlite::SqliteConnectOptions>()
            .expect("options")
            .connect()
            .await
            .expect("in-memory SQLite");
        sqlx::raw_sql(super::super::schema::INTENTS_SCHEMA)
            .execute(&mut connection)
            .await
            .expect("schema");
        connection
    }

    fn begin(
        key: &str,
        attempt: &str,
    ) -> (IntentCommand, oneshot::Receiver<Result<Begun, StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let request = BeginRequest {
            key: key.to_owned(),
            route: "r".to_owned(),
            fence: 7,
            fingerprint: "fp".to_owned(),
            attempt: attempt.to_owned(),
            attempt_expires_ms: 1_000,
            now_ms: 10,
            expires_ms: 100_000,
        };
        (IntentCommand::Begin { request, reply }, answer)
    }

    fn complete(key: &str) -> (IntentCommand, oneshot::Receiver<Result<bool, StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let outcome = StoredOutcome {
            status: 201,
            headers: Vec::new(),
            body: bytes::Bytes::from_static(b"done"),
            body_complete: true,
        };
        let command = IntentCommand::Complete {
            key: key.to_owned(),
            outcome,
            now_ms: 20,
            reply,
        };
        (command, answer)
    }

    fn release(key: &str) -> (IntentCommand, oneshot::Receiver<Result<bool, StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let command = IntentCommand::Resolve {
            key: key.to_owned(),
            resolution: Resolution::Release,
            now_ms: 20,
            reply,
        };
        (command, answer)
    }

    async fn stored_state(connection: &mut SqliteConnection, key: &str) -> Option<String> {
        sqlx::query_scalar("SELECT state FROM intents WHERE key = ?")
            .bind(key)
            .fetch_optional(connection)
            .await
            .expect("read back")
    }

    /// Commands on one key in one run see each other's effects, in order, as if run one by one.
    #[tokio::test]
    async fn a_run_decides_in_order_and_writes_the_end_state() {
        let mut connection = memory_store().await;
        let (first, first_answer) = begin("a", "one");
        let (duplicate, duplicate_answer) = begin("a", "two");
        let (done, done_answer) = complete("a");
        let (replay, replay_answer) = begin("a", "three");
        let (b, b_answer) = begin("b", "one");
        let (b_released, b_released_answer) = release("b");
        let (b_again, b_again_answer) = begin("b", "two");
        let (c_released, c_released_answer) = release("c");
        let (c, _c_answer) = begin("c", "one");
        let (c_released_late, c_released_late_answer) = release("c");
        let run = vec![
            first,
            duplicate,
            done,
            replay,
            b,
            b_released,
            b_again,
            c_released,
            c,
            c_released_late,
        ];
        let answers = apply_run(&mut connection, run)
            .await
            .map_err(|(e, _)| e)
            .expect("run");
        answers.into_iter().for_each(|answer| answer(None));
        assert_eq!(first_answer.await.unwrap().unwrap(), Begun::Fresh);
        assert!(matches!(
            duplicate_answer.await.unwrap().unwrap(),
            Begun::InFlight { .. }
        ));
        assert!(done_answer.await.unwrap().unwrap());
        assert!(matches!(
            replay_answer.await.unwrap().unwrap(),
            Begun::Completed(StoredOutcome { status: 201, .. })
        ));
        assert_eq!(b_answer.await.unwrap().unwrap(), Begun::Fresh);
        assert!(b_released_answer.await.unwrap().unwrap());
        assert_eq!(b_again_answer.await.unwrap().unwrap(), Begun::Fresh);
        assert!(
            !c_released_answer.await.unwrap().unwrap(),
            "nothing to release yet"
        );
        assert!(c_released_late_answer.await.unwrap().unwrap());
        assert_eq!(
            stored_state(&mut connection, "a").await.as_deref(),
            Some("COMPLETED")
        );
        assert_eq!(
            stored_state(&mut connection, "b").await.as_deref(),
            Some("SUBMITTING")
        );
        assert_eq!(stored_state(&mut connection, "c").await, None);
    }

    #[tokio::test]
    async fn a_corrupt_row_fails_its_own_commands_and_is_left_alone() {
        let mut connection = memory_store().await;
        sqlx::raw_sql(
            "INSERT INTO intents VALUES ('bad', 'r', 1, 'fp', 'SUBMITTING', NULL, 0, 0, 0, 999999, '{')",
        )
        .execute(&mut connection)
        .await
        .unwrap();
        let (on_bad, bad_answer) = complete("bad");
        let (good, good_answer) = begin("good", "one");
        let answers = apply_run(&mut connection, vec![on_bad, good])
            .await
            .map_err(|(e, _)| e)
            .expect("run");
        answers.into_iter().for_each(|answer| answer(None));
        let error = bad_answer.await.unwrap().unwrap_err().to_string();
        assert!(error.contains("unreadable stored record"), "{error}");
        assert_eq!(good_answer.await.unwrap().unwrap(), Begun::Fresh);
        let outcome: Option<String> =
            sqlx::query_scalar("SELECT outcome FROM intents WHERE key = 'bad'")
                .fetch_one(&mut connection)
                .await
                .unwrap();
        assert_eq!(
            outcome.as_deref(),
            Some("{"),
            "the corrupt row is not rewritten"
        );
    }
}
