//! Flat combining for a backend with one owner of its connection (the embedded store): callers
//! queue commands, and whichever caller finds the owner idle spawns the task that drains the queue
//! in batches, on its own runtime thread. No standing writer task on another thread means no
//! thread hop to reach it: a request's command is written by the thread that serves the request,
//! or by the batch already in flight, which takes it with the next round.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::future::BoxFuture;
use tokio::sync::OwnedMutexGuard;

/// The single owner of a connection, driven one batch at a time.
pub(crate) trait BatchWriter: Send + 'static {
    type Command: Send + 'static;

    /// Answers every command of `batch`, draining it.
    fn process<'a>(&'a mut self, batch: &'a mut Vec<Self::Command>) -> BoxFuture<'a, ()>;
}

/// A queue of commands in front of one [`BatchWriter`].
pub(crate) struct Combiner<W: BatchWriter> {
    shared: Arc<Shared<W>>,
}

struct Shared<W: BatchWriter> {
    /// Commands not yet taken by a batch, oldest first.
    pending: Mutex<Vec<W::Command>>,
    /// Held by the task draining `pending`; only ever tried, never waited for.
    writer: Arc<tokio::sync::Mutex<W>>,
    max_batch: usize,
}

impl<W: BatchWriter> Shared<W> {
    fn pending(&self) -> MutexGuard<'_, Vec<W::Command>> {
        // A panic while the lock was held cannot leave the queue half-written (push and drain
        // are single calls), so a poisoned lock is still a consistent queue.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<W: BatchWriter> Combiner<W> {
    /// Wraps `writer`; a batch takes at most `max_batch` commands (at least one).
    pub(crate) fn new(writer: W, max_batch: usize) -> Combiner<W> {
        Combiner {
            shared: Arc::new(Shared {
                pending: Mutex::new(Vec::new()),
                writer: Arc::new(tokio::sync::Mutex::new(writer)),
                max_batch: max_batch.max(1),
            }),
        }
    }

    /// Queues `command`. When no batch is running, starts the drain on the calling runtime;
    /// otherwise the running drain takes the command with its next batch. Must be called from
    /// within a tokio runtime.
    pub(crate) fn submit(&self, command: W::Command) {
        self.shared.pending().push(command);
        if let Ok(writer) = Arc::clone(&self.shared.writer).try_lock_owned() {
            tokio::spawn(drain(Arc::clone(&self.shared), writer));
        }
    }
}

/// Runs batches until the queue is empty. A spawned task, not the submitter's own future, so a
/// caller that gives up (a timeout, a closed client connection) cannot cancel a batch half-way.
async fn drain<W: BatchWriter>(shared: Arc<Shared<W>>, mut writer: OwnedMutexGuard<W>) {
    let mut batch = Vec::with_capacity(shared.max_batch.min(1024));
    loop {
        {
            let mut pending = shared.pending();
            let take = pending.len().min(shared.max_batch);
            batch.extend(pending.drain(..take));
        }
        if batch.is_empty() {
            drop(writer);
            // A submitter that queued after the check above and found the writer held left its
            // command to this task: look once more now that the writer is free. If somebody else
            // has taken the writer meanwhile, that task will see the command.
            if shared.pending().is_empty() {
                return;
            }
            match Arc::clone(&shared.writer).try_lock_owned() {
                Ok(again) => {
                    writer = again;
                    continue;
                }
                Err(_) => return,
            }
        }
        writer.process(&mut batch).await;
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::oneshot;

    /// Records the batches it sees; answers each command with the size of its batch.
    struct Recorder {
        batches: Arc<Mutex<Vec<Vec<u32>>>>,
        pause: Duration,
    }

    impl BatchWriter for Recorder {
        type Command = (u32, oneshot::Sender<usize>);

        fn process<'a>(&'a mut self, batch: &'a mut Vec<Self::Command>) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                tokio::time::sleep(self.pause).await;
                let size = batch.len();
                let mut seen = Vec::new();
                for (value, reply) in batch.drain(..) {
                    seen.push(value);
                    let _ = reply.send(size);
                }
                self.batches.lock().expect("recorder lock").push(seen);
            })
        }
    }

    fn recorder(pause: Duration) -> (Recorder, Arc<Mutex<Vec<Vec<u32>>>>) {
        let batches = Arc::new(Mutex::new(Vec::new()));
        (
            Recorder {
                batches: Arc::clone(&batches),
                pause,
            },
            batches,
        )
    }

    #[tokio::test]
    async fn a_lone_command_is_answered_in_a_batch_of_one() {
        let (writer, batches) = recorder(Duration::ZERO);
        let combiner = Combiner::new(writer, 10);
        let (reply, answer) = oneshot::channel();
        combiner.submit((7, reply));
        assert_eq!(answer.await.expect("answered"), 1);
        assert_eq!(*batches.lock().expect("lock"), vec![vec![7]]);
    }

    #[tokio::test]
    async fn commands_queued_behind_a_running_batch_go_together_in_order_and_within_max_batch() {
        let (writer, batches) = recorder(Duration::from_millis(20));
        let combiner = Combiner::new(writer, 4);
        let mut answers = Vec::new();
        for value in 0..10 {
            let (reply, answer) = oneshot::channel();
            combiner.submit((value, reply));
            answers.push(answer);
        }
        for answer in answers {
            answer.await.expect("every command is answered");
        }
        let seen = batches.lock().expect("lock").clone();
        // The first submit started the drain; the spawned task first ran after all ten were
        // queued (this runtime has one thread), so it took them four at a time, oldest first.
        assert_eq!(seen, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_command_is_stranded_when_submitters_race_the_drain() {
        let (writer, batches) = recorder(Duration::ZERO);
        let combiner = Arc::new(Combiner::new(writer, 3));
        let mut tasks = Vec::new();
        for task in 0..8u32 {
            let combiner = Arc::clone(&combiner);
            tasks.push(tokio::spawn(async move {
                for i in 0..500u32 {
                    let (reply, answer) = oneshot::channel();
                    combiner.submit((task * 1000 + i, reply));
                    tokio::time::timeout(Duration::from_secs(5), answer)
                        .await
                        .expect("answered, not stranded")
                        .expect("a reply");
                }
            }));
        }
        for task in tasks {
            task.await.expect("submitter");
        }
        let seen = batches.lock().expect("lock").clone();
        assert_eq!(seen.iter().map(Vec::len).sum::<usize>(), 8 * 500);
        assert!(seen
            .iter()
            .all(|batch| !batch.is_empty() && batch.len() <= 3));
        // Each submitter's commands were written in the order it sent them.
        for task in 0..8u32 {
            let mine: Vec<u32> = seen
                .iter()
                .flatten()
                .copied()
                .filter(|v| v / 1000 == task)
                .collect();
            assert_eq!(mine, (0..500).map(|i| task * 1000 + i).collect::<Vec<_>>());
        }
    }
}
