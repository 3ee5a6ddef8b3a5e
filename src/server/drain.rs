//! The listener's drain on shutdown: every connection holds a watcher; the drain tells them all
//! to finish what they are answering and close, then waits until the last watcher is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

/// Held by the listener.
#[derive(Debug)]
pub struct Drain {
    signal: watch::Sender<bool>,
    /// The same news as `signal`, read once per request without the channel's lock.
    begun: Arc<AtomicBool>,
}

/// Held by one connection until it ends.
#[derive(Debug, Clone)]
pub struct DrainWatcher {
    signal: watch::Receiver<bool>,
    begun: Arc<AtomicBool>,
}

impl Drain {
    pub fn new() -> Drain {
        Drain {
            signal: watch::Sender::new(false),
            begun: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn watcher(&self) -> DrainWatcher {
        DrainWatcher {
            signal: self.signal.subscribe(),
            begun: Arc::clone(&self.begun),
        }
    }

    /// Tells every connection to drain, and resolves once all have ended.
    pub async fn drain(self) {
        self.begun.store(true, Ordering::Release);
        self.signal.send_replace(true);
        self.signal.closed().await;
    }
}

impl Default for Drain {
    fn default() -> Self {
        Drain::new()
    }
}

impl DrainWatcher {
    /// Whether the drain has begun.
    pub fn is_draining(&self) -> bool {
        self.begun.load(Ordering::Acquire)
    }

    /// Resolves when the drain begins (or the listener is gone).
    pub async fn draining(mut self) {
        let _ = self.signal.wait_for(|draining| *draining).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_drain_tells_every_watcher_and_waits_for_the_last() {
        let drain = Drain::new();
        let watcher = drain.watcher();
        assert!(!watcher.is_draining());
        let connection = tokio::spawn({
            let watcher = watcher.clone();
            async move {
                watcher.clone().draining().await;
                assert!(watcher.is_draining());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        drop(watcher);
        let started = std::time::Instant::now();
        drain.drain().await;
        assert!(started.elapsed() >= Duration::from_millis(50));
        connection.await.expect("the connection's task");
    }
}
