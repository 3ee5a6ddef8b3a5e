//! Collects concurrent PostgreSQL requests of one kind into batches and runs at most a few
//! batches at once, each as one statement: requests that arrive while those run wait and go
//! together in the next batch.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use sqlx::postgres::PgPool;
use tokio::sync::{mpsc, Semaphore};

/// Requests that may queue for a batch before callers wait (their store timeout still runs).
const QUEUE: usize = 16 * 1024;

/// Runs one batch on the pool and answers each of its requests.
pub(super) type Execute<R> = fn(PgPool, Vec<R>) -> BoxFuture<'static, ()>;

/// Starts a batching task; requests sent to the returned queue are answered by `execute`.
pub(super) fn start<R: Send + 'static>(
    pool: PgPool,
    max_batch: usize,
    in_flight: usize,
    execute: Execute<R>,
) -> mpsc::Sender<R> {
    let (queue, requests) = mpsc::channel(QUEUE);
    let batcher = Batcher {
        pool,
        max_batch: max_batch.max(1),
        in_flight: Arc::new(Semaphore::new(in_flight.max(1))),
        execute,
    };
    tokio::spawn(batcher.run(requests));
    queue
}

struct Batcher<R> {
    pool: PgPool,
    max_batch: usize,
    in_flight: Arc<Semaphore>,
    execute: Execute<R>,
}

impl<R: Send + 'static> Batcher<R> {
    async fn run(self, mut requests: mpsc::Receiver<R>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        loop {
            // Waiting for a turn first lets more requests join the next batch.
            let Ok(permit) = Arc::clone(&self.in_flight).acquire_owned().await else {
                return;
            };
            if requests.recv_many(&mut batch, self.max_batch).await == 0 {
                return;
            }
            let work = (self.execute)(self.pool.clone(), std::mem::take(&mut batch));
            tokio::spawn(async move {
                work.await;
                drop(permit);
            });
        }
    }
}
