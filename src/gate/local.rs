//! The in-process per-key gate: a FIFO lock per resource key, created on first use and dropped
//! when nobody holds or waits for it, so memory is bounded by the requests in flight.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Per-key FIFO locks (tokio's `Mutex` grants waiters in the order they queued).
#[derive(Default)]
pub struct LocalGate {
    keys: DashMap<Box<str>, Arc<Mutex<()>>>,
}

/// The right to forward one write of a key; the key opens again when it is dropped.
pub struct LocalPass {
    _guard: OwnedMutexGuard<()>,
    _entry: Entry,
    waited: bool,
}

impl LocalPass {
    /// Whether the key was held when this pass was asked for (the request queued for its turn).
    pub fn waited(&self) -> bool {
        self.waited
    }
}

/// A busy key's turn, not yet queued for.
pub struct Busy {
    lock: Arc<Mutex<()>>,
    entry: Entry,
}

impl Busy {
    /// Queues for the key's turn. Dropping the future while waiting leaves the queue cleanly.
    pub async fn wait(self) -> LocalPass {
        LocalPass {
            _guard: self.lock.lock_owned().await,
            _entry: self.entry,
            waited: true,
        }
    }
}

/// A reference to a key's lock that removes the key from the map when it was the last one.
struct Entry {
    gate: Arc<LocalGate>,
    key: Box<str>,
    lock: Option<Arc<Mutex<()>>>,
}

impl LocalGate {
    /// Waits for the key's turn. Dropping the future while waiting leaves the queue cleanly.
    pub async fn enter(self: &Arc<Self>, key: &str) -> LocalPass {
        match self.try_enter(key) {
            Ok(pass) => pass,
            Err(busy) => busy.wait().await,
        }
    }

    /// Takes the key's turn if the key is open (nobody holds it or waits for it), without
    /// waiting; `Err` when it is busy, to be waited for with [`Busy::wait`].
    pub fn try_enter(self: &Arc<Self>, key: &str) -> Result<LocalPass, Busy> {
        let lock = self
            .keys
            .entry(key.into())
            .or_insert_with(|| Arc::new(Mutex::new(())))
            .clone();
        let entry = Entry {
            gate: Arc::clone(self),
            key: key.into(),
            lock: Some(Arc::clone(&lock)),
        };
        // An open key is taken at once, as `lock_owned` would; a held one is queued for by the
        // caller.
        match Arc::clone(&lock).try_lock_owned() {
            Ok(guard) => Ok(LocalPass {
                _guard: guard,
                _entry: entry,
                waited: false,
            }),
            Err(_) => Err(Busy { lock, entry }),
        }
    }

    /// Keys currently held or waited for.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // Fields drop after this body runs; let go of this reference first so the count below
        // sees only the map's own (and other holders' or waiters').
        drop(self.lock.take());
        self.gate
            .keys
            .remove_if(&self.key, |_, lock| Arc::strong_count(lock) == 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_holder_per_key_in_arrival_order_and_idle_keys_are_dropped() {
        let gate = Arc::new(LocalGate::default());
        let first = gate.enter("k").await;
        assert!(!first.waited(), "an open key is entered without waiting");
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for n in 0..5 {
            let gate = Arc::clone(&gate);
            let order = Arc::clone(&order);
            waiters.push(tokio::spawn(async move {
                let pass = gate.enter("k").await;
                assert!(pass.waited(), "a held key is waited for");
                order.lock().unwrap().push(n);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }));
            // Let each waiter queue before the next one.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let other = tokio::time::timeout(Duration::from_millis(50), gate.enter("other")).await;
        assert!(other.is_ok(), "another key is not blocked");
        drop(other);
        assert!(
            order.lock().unwrap().is_empty(),
            "nobody passed while the key was held"
        );
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert!(gate.is_empty(), "idle keys are dropped");
    }

    #[tokio::test]
    async fn try_enter_takes_an_open_key_and_hands_back_a_busy_one_to_queue_for() {
        let gate = Arc::new(LocalGate::default());
        let first = gate.try_enter("k").ok().expect("an open key is taken");
        assert!(!first.waited());
        let Err(busy) = gate.try_enter("k") else {
            panic!("a held key is busy");
        };
        let queued = tokio::spawn(busy.wait());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!queued.is_finished(), "the turn waits for the holder");
        drop(first);
        let second = queued.await.expect("the queued turn");
        assert!(second.waited());
        drop(second);
        assert!(gate.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_no_entry_behind() {
        let gate = Arc::new(LocalGate::default());
        let held = gate.enter("k").await;
        let gave_up = tokio::time::timeout(Duration::from_millis(10), gate.enter("k")).await;
        assert!(gave_up.is_err());
        drop(held);
        assert!(gate.is_empty());
    }
}
