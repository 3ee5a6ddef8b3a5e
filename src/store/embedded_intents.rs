//! Intent records in the embedded store: the `intents` table and the writer task's intent
//! commands. The writer runs each batch's intent commands in one transaction, so every `begin` is
//! read → `decide_begin` → write with nobody in between, and the batch shares one fsync.

use std::sync::Arc;

use sqlx::sqlite::SqliteConnection;
use sqlx::Connection as _;
use tokio::sync::oneshot;

use super::intent_rows::{encode_ms, CorruptIntent, IntentRow};
use super::intents::{decide_begin, BeginRequest, Begun, IntentRecord, Resolution, StoredOutcome};
use super::StoreError;

const BACKEND: &str = "embedded";

/// The intents table, created at open next to the marks. `fence` holds the u64 bit for bit like
/// `fence_marks.mark`; times are milliseconds since the epoch; `outcome` is
/// `StoredOutcome::to_json()`. A plain rowid table, since a row may carry a replayable body.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS intents (
    key                TEXT    PRIMARY KEY NOT NULL,
    route              TEXT    NOT NULL,
    fence              INTEGER NOT NULL,
    fingerprint        TEXT    NOT NULL,
    state              TEXT    NOT NULL,
    attempt            TEXT,
    attempt_expires_ms INTEGER NOT NULL,
    created_ms         INTEGER NOT NULL,
    updated_ms         INTEGER NOT NULL,
    expires_ms         INTEGER NOT NULL,
    outcome            TEXT
);
CREATE INDEX IF NOT EXISTS intents_submitting_by_updated
    ON intents (updated_ms) WHERE state = 'SUBMITTING';
CREATE INDEX IF NOT EXISTS intents_by_expiry ON intents (expires_ms);
";

const COLUMNS: &str = "key, route, fence, fingerprint, state, attempt, attempt_expires_ms, \
                       created_ms, updated_ms, expires_ms, outcome";

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// An `IntentStore` call, queued for the writer task.
pub(super) enum IntentCommand {
    Begin {
        request: BeginRequest,
        reply: Reply<Begun>,
    },
    Complete {
        key: String,
        outcome: StoredOutcome,
        now_ms: u64,
        reply: Reply<bool>,
    },
    Abandon {
        key: String,
        attempt: String,
        now_ms: u64,
        reply: Reply<()>,
    },
    Get {
        key: String,
        reply: Reply<Option<IntentRecord>>,
    },
    ListSubmitting {
        updated_before_ms: u64,
        limit: usize,
        reply: Reply<Vec<IntentRecord>>,
    },
    Resolve {
        key: String,
        resolution: Resolution,
        now_ms: u64,
        reply: Reply<bool>,
    },
    Prune {
        now_ms: u64,
        limit: usize,
        reply: Reply<usize>,
    },
}

impl IntentCommand {
    /// Answers the command with `error` without running it.
    pub(super) fn fail(self, error: StoreError) {
        match self {
            IntentCommand::Begin { reply, .. } => drop(reply.send(Err(error))),
            IntentCommand::Complete { reply, .. } | IntentCommand::Resolve { reply, .. } => {
                drop(reply.send(Err(error)))
            }
            IntentCommand::Abandon { reply, .. } => drop(reply.send(Err(error))),
            IntentCommand::Get { reply, .. } => drop(reply.send(Err(error))),
            IntentCommand::ListSubmitting { reply, .. } => drop(reply.send(Err(error))),
            IntentCommand::Prune { reply, .. } => drop(reply.send(Err(error))),
        }
    }
}

/// Why one command failed: a SQL error aborts the batch's transaction, a corrupt record only
/// fails the command that read it (nothing was written for it).
pub(super) enum Failure {
    Sql(sqlx::Error),
    Corrupt(CorruptIntent),
}

impl From<sqlx::Error> for Failure {
    fn from(source: sqlx::Error) -> Failure {
        Failure::Sql(source)
    }
}

/// An answer computed inside the transaction, sent once the transaction's fate is known
/// (`Some(error)`: it was rolled back and the caller gets the error instead).
type Pending = Box<dyn FnOnce(Option<StoreError>) + Send>;

/// Runs `commands` in one transaction and answers each after the commit (or with the error).
pub(super) async fn apply(connection: &mut SqliteConnection, commands: Vec<IntentCommand>) {
    if commands.is_empty() {
        return;
    }
    let mut transaction = match connection.begin().await {
        Ok(transaction) => transaction,
        Err(source) => return fail_all(commands, &Arc::new(source)),
    };
    let mut pending: Vec<Pending> = Vec::with_capacity(commands.len());
    let mut commands = commands.into_iter();
    let mut failed = None;
    for command in commands.by_ref() {
        match execute(&mut transaction, command).await {
            Ok(answer) => pending.push(answer),
            Err((source, answer)) => {
                pending.push(answer);
                failed = Some(source);
                break;
            }
        }
    }
    let failed = match failed {
        Some(source) => {
            if let Err(e) = transaction.rollback().await {
                tracing::warn!(error = %e, "rolling back embedded intent writes failed");
            }
            Some(source)
        }
        None => transaction.commit().await.err(),
    };
    match failed {
        None => pending.into_iter().for_each(|answer| answer(None)),
        Some(source) => {
            tracing::error!(error = %source, "embedded store intent transaction failed");
            let source = Arc::new(source);
            for answer in pending {
                answer(Some(backend_error(&source)));
            }
            fail_all(commands.collect(), &source);
        }
    }
}

fn fail_all(commands: Vec<IntentCommand>, source: &Arc<sqlx::Error>) {
    for command in commands {
        command.fail(backend_error(source));
    }
}

/// Runs one command; on a SQL error hands back the error and the command's reply.
async fn execute(
    connection: &mut SqliteConnection,
    command: IntentCommand,
) -> Result<Pending, (sqlx::Error, Pending)> {
    match command {
        IntentCommand::Begin { request, reply } => settle(reply, begin(connection, &request).await),
        IntentCommand::Complete {
            key,
            outcome,
            now_ms,
            reply,
        } => settle(
            reply,
            record_outcome(connection, &key, &outcome, now_ms).await,
        ),
        IntentCommand::Abandon {
            key,
            attempt,
            now_ms,
            reply,
        } => settle(reply, abandon(connection, &key, &attempt, now_ms).await),
        IntentCommand::Get { key, reply } => settle(reply, get(connection, &key).await),
        IntentCommand::ListSubmitting {
            updated_before_ms,
            limit,
            reply,
        } => settle(
            reply,
            list_submitting(connection, updated_before_ms, limit).await,
        ),
        IntentCommand::Resolve {
            key,
            resolution,
            now_ms,
            reply,
        } => {
            let resolved = match resolution {
                Resolution::Outcome(outcome) => {
                    record_outcome(connection, &key, &outcome, now_ms).await
                }
                Resolution::Release => release(connection, &key).await,
            };
            settle(reply, resolved)
        }
        IntentCommand::Prune {
            now_ms,
            limit,
            reply,
        } => settle(reply, prune(connection, now_ms, limit).await),
    }
}

/// Turns a command's result into its pending answer (or the batch-aborting SQL error).
fn settle<T: Send + 'static>(
    reply: Reply<T>,
    result: Result<T, Failure>,
) -> Result<Pending, (sqlx::Error, Pending)> {
    let answer = |value: Result<T, StoreError>| -> Pending {
        Box::new(move |failure: Option<StoreError>| {
            let _ = reply.send(match failure {
                Some(error) => Err(error),
                None => value,
            });
        })
    };
    match result {
        Ok(value) => Ok(answer(Ok(value))),
        Err(Failure::Corrupt(corrupt)) => Ok(answer(Err(StoreError::Backend {
            backend: BACKEND,
            source: Arc::new(corrupt),
        }))),
        // The value is never sent: the batch is rolled back and every answer gets the error.
        Err(Failure::Sql(source)) => Err((source, answer(Err(StoreError::Closed)))),
    }
}

async fn begin(
    connection: &mut SqliteConnection,
    request: &BeginRequest,
) -> Result<Begun, Failure> {
    let existing = get(connection, &request.key).await?;
    let (begun, write) = decide_begin(existing.as_ref(), request);
    if let Some(record) = write {
        write_record(connection, &record).await?;
    }
    Ok(begun)
}

/// Inserts `record`, replacing whatever the key held.
async fn write_record(
    connection: &mut SqliteConnection,
    record: &IntentRecord,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "INSERT OR REPLACE INTO intents ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ))
    .bind(&record.key)
    .bind(&record.route)
    .bind(encode_fence(record.fence))
    .bind(&record.fingerprint)
    .bind(record.state.as_str())
    .bind(record.attempt.as_deref())
    .bind(encode_ms(record.attempt_expires_ms))
    .bind(encode_ms(record.created_ms))
    .bind(encode_ms(record.updated_ms))
    .bind(encode_ms(record.expires_ms))
    .bind(record.outcome.as_ref().map(StoredOutcome::to_json))
    .execute(connection)
    .await
    .map(|_| ())
}

/// Completes a SUBMITTING intent with `outcome` (a call's answer, or an operator's word).
async fn record_outcome(
    connection: &mut SqliteConnection,
    key: &str,
    outcome: &StoredOutcome,
    now_ms: u64,
) -> Result<bool, Failure> {
    let done = sqlx::query(
        "UPDATE intents SET state = 'COMPLETED', outcome = ?, attempt = NULL, updated_ms = ? \
         WHERE key = ? AND state = 'SUBMITTING'",
    )
    .bind(outcome.to_json())
    .bind(encode_ms(now_ms))
    .bind(key)
    .execute(connection)
    .await?;
    Ok(done.rows_affected() == 1)
}

async fn abandon(
    connection: &mut SqliteConnection,
    key: &str,
    attempt: &str,
    now_ms: u64,
) -> Result<(), Failure> {
    sqlx::query(
        "UPDATE intents SET attempt = NULL, attempt_expires_ms = ?, updated_ms = ? \
         WHERE key = ? AND attempt = ? AND state = 'SUBMITTING'",
    )
    .bind(encode_ms(now_ms))
    .bind(encode_ms(now_ms))
    .bind(key)
    .bind(attempt)
    .execute(connection)
    .await?;
    Ok(())
}

async fn release(connection: &mut SqliteConnection, key: &str) -> Result<bool, Failure> {
    let deleted = sqlx::query("DELETE FROM intents WHERE key = ? AND state = 'SUBMITTING'")
        .bind(key)
        .execute(connection)
        .await?;
    Ok(deleted.rows_affected() == 1)
}

async fn get(
    connection: &mut SqliteConnection,
    key: &str,
) -> Result<Option<IntentRecord>, Failure> {
    let row: Option<IntentRow> =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM intents WHERE key = ?"))
            .bind(key)
            .fetch_optional(connection)
            .await?;
    row.map(decode_row).transpose()
}

async fn list_submitting(
    connection: &mut SqliteConnection,
    updated_before_ms: u64,
    limit: usize,
) -> Result<Vec<IntentRecord>, Failure> {
    let rows: Vec<IntentRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM intents WHERE state = 'SUBMITTING' AND updated_ms < ? \
         ORDER BY updated_ms, key LIMIT ?"
    ))
    .bind(encode_ms(updated_before_ms))
    .bind(encode_count(limit))
    .fetch_all(connection)
    .await?;
    rows.into_iter().map(decode_row).collect()
}

async fn prune(
    connection: &mut SqliteConnection,
    now_ms: u64,
    limit: usize,
) -> Result<usize, Failure> {
    let deleted = sqlx::query(
        "DELETE FROM intents WHERE key IN \
         (SELECT key FROM intents WHERE expires_ms <= ? ORDER BY expires_ms LIMIT ?)",
    )
    .bind(encode_ms(now_ms))
    .bind(encode_count(limit))
    .execute(connection)
    .await?;
    Ok(usize::try_from(deleted.rows_affected()).unwrap_or(usize::MAX))
}

/// Fences are stored bit for bit as SQLite's signed integer, like marks.
fn encode_fence(fence: u64) -> i64 {
    i64::from_ne_bytes(fence.to_ne_bytes())
}

fn decode_fence(stored: i64) -> u64 {
    u64::from_ne_bytes(stored.to_ne_bytes())
}

fn encode_count(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

fn backend_error(source: &Arc<sqlx::Error>) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::clone(source) as Arc<dyn std::error::Error + Send + Sync>,
    }
}

/// Decodes a row, failing only the command that read it when the row is corrupt.
fn decode_row(row: IntentRow) -> Result<IntentRecord, Failure> {
    row.decode(decode_fence).map_err(Failure::Corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_round_trip_and_times_saturate() {
        for fence in [0, 1, 1 << 63, u64::MAX] {
            assert_eq!(decode_fence(encode_fence(fence)), fence);
        }
        assert_eq!(encode_ms(5), 5);
        assert_eq!(encode_ms(u64::MAX), i64::MAX);
    }

    #[tokio::test]
    async fn a_corrupt_record_is_an_error_for_its_command_only() {
        use sqlx::ConnectOptions as _;
        let mut connection = "sqlite::memory:"
            .parse::<sqlx::sqlite::SqliteConnectOptions>()
            .unwrap()
            .connect()
            .await
            .unwrap();
        sqlx::raw_sql(SCHEMA)
            .execute(&mut connection)
            .await
            .unwrap();
        sqlx::raw_sql(
            "INSERT INTO intents VALUES ('bad', 'r', 1, 'fp', 'COMPLETED', NULL, 0, 0, 0, 9, '{')",
        )
        .execute(&mut connection)
        .await
        .unwrap();
        let (bad, bad_answer) = oneshot::channel();
        let (good, good_answer) = oneshot::channel();
        let commands = vec![
            IntentCommand::Get {
                key: "bad".to_owned(),
                reply: bad,
            },
            IntentCommand::Prune {
                now_ms: 100,
                limit: 10,
                reply: good,
            },
        ];
        apply(&mut connection, commands).await;
        let error = bad_answer.await.unwrap().unwrap_err().to_string();
        assert!(error.contains("unreadable stored record"), "{error}");
        assert_eq!(good_answer.await.unwrap().unwrap(), 1);
    }
}
