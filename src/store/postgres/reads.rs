//! Batched mark reads on PostgreSQL (the ordering gate's re-check after a dedicated wait, the
//! admin API): the marks of every key asked for while the previous read ran, in one
//! `SELECT … WHERE key = ANY(…)`.

use std::collections::HashMap;

use sqlx::postgres::PgPool;
use tokio::sync::{mpsc, oneshot};

use super::codec::decode_mark;
use super::fail_batch;
use crate::store::plumbing::batches::{run_batches, QUEUE};
use crate::store::StoreError;

pub(super) struct ReadRequest {
    pub key: String,
    pub reply: oneshot::Sender<Result<Option<u64>, StoreError>>,
}

/// Starts the read batcher on the calling runtime: reads sent to the returned queue are answered
/// in batches of at most `max_batch`, up to `in_flight` batches at once, on `pool`.
pub(super) fn start(pool: PgPool, max_batch: usize, in_flight: usize) -> mpsc::Sender<ReadRequest> {
    let (queue, requests) = mpsc::channel(QUEUE);
    tokio::spawn(run_batches(requests, max_batch, in_flight, move |batch| {
        read_marks(pool.clone(), batch)
    }));
    queue
}

/// Reads the marks of a batch's keys with one statement and answers each request.
async fn read_marks(pool: PgPool, batch: Vec<ReadRequest>) {
    let mut keys: Vec<&str> = batch.iter().map(|r| r.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    let rows: Result<Vec<(String, i64)>, sqlx::Error> = sqlx::query_as(
        "SELECT key, mark FROM fence_marks WHERE key = ANY($1) AND mark IS NOT NULL",
    )
    .bind(&keys)
    .fetch_all(&pool)
    .await;
    match rows {
        Ok(rows) => {
            let marks: HashMap<String, u64> = rows
                .into_iter()
                .map(|(key, mark)| (key, decode_mark(mark)))
                .collect();
            for request in batch {
                let _ = request.reply.send(Ok(marks.get(&request.key).copied()));
            }
        }
        Err(source) => {
            tracing::error!(error = %source, "postgres mark read failed");
            fail_batch(batch.into_iter().map(|r| r.reply), source);
        }
    }
}
