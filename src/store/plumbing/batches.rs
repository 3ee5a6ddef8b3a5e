//! Batching with a few batches in flight: the requests that arrive while batches run go together
//! in the next one, at most `in_flight` batches at once, each a task of its own on the batching
//! task's runtime. Used by PostgreSQL's per-thread batchers and etcd's ([`call_batched`]).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::inbox::Inbox;
use super::mailbox::ask;
use super::per_thread::PerThread;
use crate::store::StoreError;

/// Requests that may queue for a batching task before callers wait (their store timeout still
/// runs).
pub(crate) const QUEUE: usize = 16 * 1024;

/// Takes `requests` in batches of at most `max_batch` (at least one) and spawns the future `run`
/// makes of each on the calling runtime, at most `in_flight` (at least one) at once. Returns once
/// the queue is closed and drained and every batch it spawned has finished.
pub(crate) async fn run_batches<R, W>(
    requests: mpsc::Receiver<R>,
    max_batch: usize,
    in_flight: usize,
    mut run: impl FnMut(Vec<R>) -> W,
) where
    R: Send,
    W: Future<Output = ()> + Send + 'static,
{
    let mut requests = Inbox::new(requests, max_batch);
    let in_flight = in_flight.max(1);
    let turns = Arc::new(Semaphore::new(in_flight));
    let mut batch = requests.empty_batch();
    loop {
        // Waiting for a turn first lets more requests join the next batch.
        let Ok(turn) = Arc::clone(&turns).acquire_owned().await else {
            return;
        };
        if !requests.next_batch(&mut batch).await {
            break;
        }
        let work = run(std::mem::take(&mut batch));
        tokio::spawn(async move {
            work.await;
            drop(turn);
        });
    }
    // The queue is closed: wait for the batches still running.
    let _ = turns
        .acquire_many(u32::try_from(in_flight).unwrap_or(u32::MAX))
        .await;
}

/// Sends the request `request` makes around its reply channel to the calling thread's batcher in
/// `queues` and waits for the answer. A thread without one starts it on its own runtime: batches
/// of at most `max_batch`, `in_flight` at once, each run by the function `start` makes.
pub(crate) async fn call_batched<R, T, F, W>(
    queues: &PerThread<mpsc::Sender<R>>,
    (max_batch, in_flight): (usize, usize),
    start: impl FnOnce() -> F,
    request: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> R,
) -> Result<T, StoreError>
where
    R: Send + 'static,
    F: FnMut(Vec<R>) -> W + Send + 'static,
    W: Future<Output = ()> + Send + 'static,
{
    let queue = queues.queue(|| {
        let (queue, requests) = mpsc::channel(QUEUE);
        tokio::spawn(run_batches(requests, max_batch, in_flight, start()));
        queue
    })?;
    ask(&queue, request).await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn requests_queued_while_batches_run_go_together_within_the_limits() {
        let (queue, requests) = mpsc::channel(QUEUE);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        for value in 0..10u32 {
            queue.send(value).await.expect("queued");
        }
        drop(queue);
        let batches = {
            let (seen, running, most) =
                (Arc::clone(&seen), Arc::clone(&running), Arc::clone(&most));
            run_batches(requests, 4, 2, move |batch: Vec<u32>| {
                let (seen, running, most) =
                    (Arc::clone(&seen), Arc::clone(&running), Arc::clone(&most));
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    seen.lock().expect("lock").push(batch);
                    running.fetch_sub(1, Ordering::SeqCst);
                }
            })
        };
        batches.await;
        // Returned only after every batch finished; all ten were queued before the first batch,
        // so they went four at a time, oldest first, at most two batches at once.
        let mut seen = seen.lock().expect("lock").clone();
        seen.sort();
        assert_eq!(seen, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        assert_eq!(running.load(Ordering::SeqCst), 0);
        assert!(most.load(Ordering::SeqCst) <= 2);
    }
}
