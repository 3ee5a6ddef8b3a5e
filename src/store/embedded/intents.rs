//! Intent records in the embedded store: how the writer runs a batch's intent commands
//! (`commands.rs`) on the `intents` table (`schema.rs`). The writer runs them in one transaction,
//! so every `begin` is read → `decide_begin` → write with nobody in between, and the batch shares
//! one fsync; runs of single-key commands share one read and one write too (`intent_batch.rs`).

use std::sync::Arc;

use sqlx::sqlite::SqliteConnection;
use sqlx::Connection as _;

use super::commands::{IntentCommand, Reply};
use super::intent_batch::{apply_alone, apply_run, is_single_key, Answer, Settled};
use super::schema::decode_fence;
use super::{backend_error, BACKEND};
use crate::store::intents::{IntentCensus, IntentRecord};
use crate::store::plumbing::intent_rows::{
    census_of, encode_ms, CorruptIntent, IntentRow, CENSUS_SQL, COLUMNS,
};
use crate::store::StoreError;

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

/// Runs `commands` in one transaction (a savepoint, inside the writer's own) and answers a
/// failure at once; what succeeded is answered by the caller once the writes are durable.
pub(super) async fn apply(
    connection: &mut SqliteConnection,
    commands: Vec<IntentCommand>,
) -> Settled {
    if commands.is_empty() {
        return Settled::default();
    }
    if commands.iter().all(is_single_key) {
        return apply_alone(connection, commands).await;
    }
    let mut transaction = match connection.begin().await {
        Ok(transaction) => transaction,
        Err(source) => {
            fail_all(commands, &Arc::new(source));
            return Settled::default();
        }
    };
    let mut pending: Vec<Answer> = Vec::with_capacity(commands.len());
    let mut commands = commands.into_iter().peekable();
    let mut failed = None;
    while failed.is_none() {
        let mut run = Vec::new();
        while let Some(command) = commands.next_if(is_single_key) {
            run.push(command);
        }
        if !run.is_empty() {
            match apply_run(&mut transaction, run).await {
                Ok(answers) => pending.extend(answers),
                Err((source, answers)) => {
                    pending.extend(answers);
                    failed = Some(source);
                }
            }
            continue;
        }
        // Listing and pruning read many rows: run on their own, after the run before them.
        let Some(command) = commands.next() else {
            break;
        };
        match execute(&mut transaction, command).await {
            Ok(answer) => pending.push(answer),
            Err((source, answer)) => {
                pending.push(answer);
                failed = Some(source);
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
        None => Settled::of(pending),
        Some(source) => {
            tracing::error!(error = %source, "embedded store intent transaction failed");
            let source = Arc::new(source);
            for answer in pending {
                answer(Some(backend_error(&source)));
            }
            fail_all(commands.collect(), &source);
            Settled::default()
        }
    }
}

fn fail_all(commands: Vec<IntentCommand>, source: &Arc<sqlx::Error>) {
    for command in commands {
        command.fail(backend_error(source));
    }
}

/// Runs one listing or pruning command; on a SQL error hands back the error and the command's
/// reply. Single-key commands go through `apply_run` instead.
async fn execute(
    connection: &mut SqliteConnection,
    command: IntentCommand,
) -> Result<Answer, (sqlx::Error, Answer)> {
    match command {
        IntentCommand::ListSubmitting {
            updated_before_ms,
            limit,
            reply,
        } => settle(
            reply,
            list_submitting(connection, updated_before_ms, limit).await,
        ),
        IntentCommand::Prune {
            now_ms,
            limit,
            reply,
        } => settle(reply, prune(connection, now_ms, limit).await),
        IntentCommand::Census { reply } => settle(reply, census(connection).await),
        // `apply` hands these to `apply_run` in runs; one alone is a run of one.
        single_key => {
            let only = |mut answers: Vec<Answer>| -> Answer {
                answers.pop().unwrap_or_else(|| Box::new(|_| ()))
            };
            match apply_run(connection, vec![single_key]).await {
                Ok(answers) => Ok(only(answers)),
                Err((source, answers)) => Err((source, only(answers))),
            }
        }
    }
}

/// Turns a command's result into its pending answer (or the batch-aborting SQL error).
fn settle<T: Send + 'static>(
    reply: Reply<T>,
    result: Result<T, Failure>,
) -> Result<Answer, (sqlx::Error, Answer)> {
    let answer = |value: Result<T, StoreError>| -> Answer {
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

async fn census(connection: &mut SqliteConnection) -> Result<IntentCensus, Failure> {
    let row: (i64, Option<i64>, i64) = sqlx::query_as(CENSUS_SQL).fetch_one(connection).await?;
    Ok(census_of(row))
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

fn encode_count(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Decodes a row, failing only the command that read it when the row is corrupt.
fn decode_row(row: IntentRow) -> Result<IntentRecord, Failure> {
    row.decode(decode_fence).map_err(Failure::Corrupt)
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::super::schema::{encode_fence, INTENTS_SCHEMA};
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
        sqlx::raw_sql(INTENTS_SCHEMA)
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
        apply(&mut connection, commands).await.send();
        let error = bad_answer.await.unwrap().unwrap_err().to_string();
        assert!(error.contains("unreadable stored record"), "{error}");
        assert_eq!(good_answer.await.unwrap().unwrap(), 1);
    }
}
