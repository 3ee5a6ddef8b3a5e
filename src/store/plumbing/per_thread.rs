//! One task per thread that asks (the Redis writers, the PostgreSQL advance batchers, the
//! PostgreSQL gate's lock holders): each thread's requests go to a task on its own runtime, so a
//! request never wakes another thread to reach its store. This module owns the thread → queue map
//! and the closed flag.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ThreadId;

use dashmap::DashMap;
use tokio::sync::mpsc;

use crate::store::StoreError;

/// A handle to a thread's task, which tells whether the task has ended.
pub(crate) trait TaskQueue: Clone {
    fn is_closed(&self) -> bool;
}

impl<C> TaskQueue for mpsc::Sender<C> {
    fn is_closed(&self) -> bool {
        mpsc::Sender::is_closed(self)
    }
}

/// The queue of each thread's task.
pub(crate) struct PerThread<Q> {
    queues: DashMap<ThreadId, Q>,
    /// Set by `close`: no task is started after it.
    closed: AtomicBool,
}

impl<Q: TaskQueue> PerThread<Q> {
    pub(crate) fn new() -> PerThread<Q> {
        PerThread {
            queues: DashMap::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// The calling thread's queue; `start` starts its task (on the calling runtime) when there is
    /// none or its runtime has ended. `Closed` after `close`.
    pub(crate) fn queue(&self, start: impl FnOnce() -> Q) -> Result<Q, StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        let thread = std::thread::current().id();
        if let Some(queue) = self.queues.get(&thread).filter(|q| !q.is_closed()) {
            return Ok(queue.clone());
        }
        let queue = start();
        self.queues.insert(thread, queue.clone());
        Ok(queue)
    }

    /// Refuses later requests and hands back every queue (to send a close through, or to drop:
    /// a task whose queue is dropped ends once it has answered what was queued).
    pub(crate) fn close(&self) -> Vec<Q> {
        self.closed.store(true, Ordering::Release);
        let queues = self.queues.iter().map(|q| q.value().clone()).collect();
        self.queues.clear();
        queues
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_gets_one_queue_and_none_is_started_after_close() {
        let queues = PerThread::<mpsc::Sender<u8>>::new();
        let (first, _first_rx) = mpsc::channel(1);
        let first = queues.queue(|| first).expect("open");
        // The same thread gets the same queue without starting another task.
        let again = queues.queue(|| panic!("started twice")).expect("open");
        assert!(first.same_channel(&again));
        // Another thread gets its own.
        let (other, _other_rx) = mpsc::channel(1);
        let other = std::thread::scope(|scope| {
            scope
                .spawn(|| queues.queue(|| other).expect("open"))
                .join()
                .expect("thread")
        });
        assert!(!other.same_channel(&first));
        assert_eq!(queues.close().len(), 2);
        assert!(matches!(
            queues.queue(|| panic!("started after close")),
            Err(StoreError::Closed)
        ));
    }

    #[test]
    fn a_queue_whose_task_ended_is_replaced() {
        let queues = PerThread::<mpsc::Sender<u8>>::new();
        let (ended, receiver) = mpsc::channel(1);
        let ended = queues.queue(|| ended).expect("open");
        drop(receiver);
        let (fresh, _fresh_rx) = mpsc::channel(1);
        let fresh = queues.queue(|| fresh).expect("open");
        assert!(!fresh.same_channel(&ended));
    }
}
