//! Intent records in PostgreSQL (`migrations/postgres/0002_intents.sql`), shared by every replica.
//! A `begin` first tries the batched insert of a fresh record (`intent_writes.rs`); a key that
//! has one takes a transaction that locks the row before `decide_begin` runs, so concurrent
//! duplicates on any replicas see each other. Outcomes are recorded in batches too; the other
//! operations are one statement.

use std::sync::Arc;

use sqlx::{PgConnection, PgPool};

use super::codec::{decode_mark, encode_mark};
use super::intent_writes::IntentWrite;
use super::{backend_error, PostgresStore, BACKEND};
use crate::store::intents::{
    decide_begin, BeginRequest, Begun, IntentCensus, IntentRecord, IntentStore, Resolution,
    StoredOutcome,
};
use crate::store::plumbing::intent_rows::{census_of, encode_ms, IntentRow, CENSUS_SQL, COLUMNS};
use crate::store::{StoreError, StoreFuture};

/// How often `begin` retries after the row it expected vanished between its insert and its lock
/// (a concurrent prune or release): each round only repeats because another replica made
/// progress, so a few rounds suffice.
const MAX_BEGIN_ROUNDS: usize = 4;

/// `$1 … $11` in `COLUMNS` order.
const VALUES: &str = "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

impl IntentStore for PostgresStore {
    fn begin(&self, request: BeginRequest) -> StoreFuture<'_, Begun> {
        Box::pin(async move {
            if let (fresh, Some(record)) = decide_begin(None, &request) {
                let inserted = self
                    .intent_writes
                    .write(|reply| IntentWrite::Insert { record, reply })
                    .await?;
                if inserted {
                    return Ok(fresh);
                }
            }
            begin(&self.pool, &request).await
        })
    }

    fn complete(&self, key: &str, outcome: StoredOutcome, now_ms: u64) -> StoreFuture<'_, bool> {
        let key = key.to_owned();
        Box::pin(async move {
            let outcome = outcome.to_json();
            self.intent_writes
                .write(|reply| IntentWrite::Complete {
                    key,
                    outcome,
                    now_ms,
                    reply,
                })
                .await
        })
    }

    fn abandon(&self, key: &str, attempt: &str, now_ms: u64) -> StoreFuture<'_, ()> {
        let (key, attempt) = (key.to_owned(), attempt.to_owned());
        Box::pin(async move {
            sqlx::query(
                "UPDATE intents SET attempt = NULL, attempt_expires_ms = $3, updated_ms = $3 \
                 WHERE key = $1 AND attempt = $2 AND state = 'SUBMITTING'",
            )
            .bind(&key)
            .bind(&attempt)
            .bind(encode_ms(now_ms))
            .execute(&self.pool)
            .await
            .map_err(backend_error)?;
            Ok(())
        })
    }

    fn get(&self, key: &str) -> StoreFuture<'_, Option<IntentRecord>> {
        let key = key.to_owned();
        Box::pin(async move {
            let row: Option<IntentRow> =
                sqlx::query_as(&format!("SELECT {COLUMNS} FROM intents WHERE key = $1"))
                    .bind(&key)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(backend_error)?;
            row.map(decode_row).transpose()
        })
    }

    fn list_submitting(
        &self,
        updated_before_ms: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<IntentRecord>> {
        Box::pin(async move {
            let rows: Vec<IntentRow> = sqlx::query_as(&format!(
                "SELECT {COLUMNS} FROM intents WHERE state = 'SUBMITTING' AND updated_ms < $1 \
                 ORDER BY updated_ms, key LIMIT $2"
            ))
            .bind(encode_ms(updated_before_ms))
            .bind(encode_count(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(backend_error)?;
            rows.into_iter().map(decode_row).collect()
        })
    }

    fn census(&self) -> StoreFuture<'_, IntentCensus> {
        Box::pin(async move {
            let row: (i64, Option<i64>, i64) = sqlx::query_as(CENSUS_SQL)
                .fetch_one(&self.pool)
                .await
                .map_err(backend_error)?;
            Ok(census_of(row))
        })
    }

    fn resolve(&self, key: &str, resolution: Resolution, now_ms: u64) -> StoreFuture<'_, bool> {
        let key = key.to_owned();
        Box::pin(async move {
            match resolution {
                Resolution::Outcome(outcome) => {
                    record_outcome(&self.pool, &key, &outcome, now_ms).await
                }
                Resolution::Release => {
                    let deleted =
                        sqlx::query("DELETE FROM intents WHERE key = $1 AND state = 'SUBMITTING'")
                            .bind(&key)
                            .execute(&self.pool)
                            .await
                            .map_err(backend_error)?;
                    Ok(deleted.rows_affected() == 1)
                }
            }
        })
    }

    fn prune(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, usize> {
        // SKIP LOCKED: rows a `begin` holds are being renewed; replicas pruning together split
        // the work instead of queueing on each other.
        Box::pin(async move {
            let deleted = sqlx::query(
                "DELETE FROM intents WHERE expires_ms <= $1 AND key IN \
                 (SELECT key FROM intents WHERE expires_ms <= $1 ORDER BY expires_ms LIMIT $2 \
                  FOR UPDATE SKIP LOCKED)",
            )
            .bind(encode_ms(now_ms))
            .bind(encode_count(limit))
            .execute(&self.pool)
            .await
            .map_err(backend_error)?;
            Ok(usize::try_from(deleted.rows_affected()).unwrap_or(usize::MAX))
        })
    }
}

/// Insert-if-absent, else lock the row, then apply `decide_begin` and write what it returns, all
/// in one transaction.
async fn begin(pool: &PgPool, request: &BeginRequest) -> Result<Begun, StoreError> {
    let insert =
        format!("INSERT INTO intents ({COLUMNS}) VALUES {VALUES} ON CONFLICT (key) DO NOTHING");
    let update = format!("UPDATE intents SET ({COLUMNS}) = {VALUES} WHERE key = $1");
    let mut transaction = pool.begin().await.map_err(backend_error)?;
    for _ in 0..MAX_BEGIN_ROUNDS {
        let (fresh, record) = decide_begin(None, request);
        if let Some(record) = record {
            let inserted = sqlx::query(&insert);
            let inserted = bind_record(inserted, &record)
                .execute(&mut *transaction)
                .await
                .map_err(backend_error)?;
            if inserted.rows_affected() == 1 {
                transaction.commit().await.map_err(backend_error)?;
                return Ok(fresh);
            }
        }
        let Some(existing) = lock(&mut transaction, &request.key).await? else {
            continue; // deleted between the insert and the lock: insert again
        };
        let (begun, write) = decide_begin(Some(&existing), request);
        if let Some(record) = write {
            let updated = sqlx::query(&update);
            bind_record(updated, &record)
                .execute(&mut *transaction)
                .await
                .map_err(backend_error)?;
        }
        transaction.commit().await.map_err(backend_error)?;
        return Ok(begun);
    }
    Err(StoreError::Setup {
        backend: BACKEND,
        detail: format!(
            "intent {}: the record kept vanishing while it was begun",
            request.key
        ),
    })
}

async fn lock(
    connection: &mut PgConnection,
    key: &str,
) -> Result<Option<IntentRecord>, StoreError> {
    let row: Option<IntentRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM intents WHERE key = $1 FOR UPDATE"
    ))
    .bind(key)
    .fetch_optional(connection)
    .await
    .map_err(backend_error)?;
    row.map(decode_row).transpose()
}

fn bind_record<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    record: &'q IntentRecord,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(&record.key)
        .bind(&record.route)
        .bind(encode_mark(record.fence))
        .bind(&record.fingerprint)
        .bind(record.state.as_str())
        .bind(record.attempt.as_deref())
        .bind(encode_ms(record.attempt_expires_ms))
        .bind(encode_ms(record.created_ms))
        .bind(encode_ms(record.updated_ms))
        .bind(encode_ms(record.expires_ms))
        .bind(record.outcome.as_ref().map(StoredOutcome::to_json))
}

/// Completes a SUBMITTING intent with `outcome` (a call's answer, or an operator's word).
async fn record_outcome(
    pool: &PgPool,
    key: &str,
    outcome: &StoredOutcome,
    now_ms: u64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE intents SET state = 'COMPLETED', outcome = $2, attempt = NULL, updated_ms = $3 \
         WHERE key = $1 AND state = 'SUBMITTING'",
    )
    .bind(key)
    .bind(outcome.to_json())
    .bind(encode_ms(now_ms))
    .execute(pool)
    .await
    .map_err(backend_error)?;
    Ok(done.rows_affected() == 1)
}

fn encode_count(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Decodes a row; a corrupt one is a backend error for the call that read it.
fn decode_row(row: IntentRow) -> Result<IntentRecord, StoreError> {
    row.decode(decode_mark)
        .map_err(|corrupt| StoreError::Backend {
            backend: BACKEND,
            source: Arc::new(corrupt),
        })
}
