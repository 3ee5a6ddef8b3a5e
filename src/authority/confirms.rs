//! `strict` and undecided tokens: a linearizable read of the holders, shared by every request
//! waiting at the time — one read per batch, at most two batches in flight.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::source::LockSource;

/// Most locks read in one batch.
const MAX_CONFIRM_BATCH: usize = 100;
/// Batches read at once.
const BATCHES_IN_FLIGHT: usize = 2;

/// One request's question: who holds `lock` now?
pub(crate) struct ConfirmAsk {
    pub(crate) lock: String,
    pub(crate) answer: oneshot::Sender<Result<Option<u64>, String>>,
}

/// Runs until every sender is dropped.
pub(crate) async fn confirm_batches(
    mut asks: mpsc::Receiver<ConfirmAsk>,
    source: Arc<dyn LockSource>,
    timeout: Duration,
) {
    let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    while let Some(first) = asks.recv().await {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        // Whatever queued while waiting for a slot joins this batch.
        let mut batch = vec![first];
        while batch.len() < MAX_CONFIRM_BATCH {
            match asks.try_recv() {
                Ok(ask) => batch.push(ask),
                Err(_) => break,
            }
        }
        let source = Arc::clone(&source);
        tokio::spawn(async move {
            answer_batch(batch, source.as_ref(), timeout).await;
            drop(slot);
        });
    }
}

async fn answer_batch(batch: Vec<ConfirmAsk>, source: &dyn LockSource, timeout: Duration) {
    let mut locks: Vec<String> = batch.iter().map(|ask| ask.lock.clone()).collect();
    locks.sort();
    locks.dedup();
    let read = match tokio::time::timeout(timeout, source.holders(&locks)).await {
        Ok(read) => read,
        Err(_) => Err(format!(
            "the lock service did not answer within {}ms",
            timeout.as_millis()
        )),
    };
    let holders: Result<HashMap<&str, Option<u64>>, String> = read.and_then(|tokens| {
        if tokens.len() == locks.len() {
            Ok(locks.iter().map(String::as_str).zip(tokens).collect())
        } else {
            Err("the lock service answered for other locks than asked".to_owned())
        }
    });
    for ask in batch {
        let answer = match &holders {
            Ok(holders) => Ok(holders.get(ask.lock.as_str()).copied().flatten()),
            Err(error) => Err(error.clone()),
        };
        // The request may have given up waiting.
        let _ = ask.answer.send(answer);
    }
}
