//! What one client connection is doing, as its socket, its service and its response bodies see
//! it: bytes read, requests open, writes blocked, responses waiting for the client. Written with
//! atomics on the connection's path; read by its [`ConnectionClock`](super::clock::ConnectionClock).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// Length of the response-slot list past which ended responses' slots are dropped on the next
/// response, before the clock's next look.
const PRUNE_AT: usize = 32;

/// Shared by one connection's stream, service and response bodies.
#[derive(Debug)]
pub struct ConnectionActivity {
    started: Instant,
    /// Bytes read from the client in all.
    read: AtomicU64,
    /// Requests handed to the service whose responses have not ended.
    open: AtomicUsize,
    /// When `open` last fell to zero (ms since `started`), and `read` at that moment.
    quiet_since_ms: AtomicU64,
    read_when_quiet: AtomicU64,
    /// When the socket's writes began to block, as ms since `started` plus one; 0: not blocked.
    write_blocked_since: AtomicU64,
    /// The connection speaks HTTP/2 (its preface or a request said so).
    http2: AtomicBool,
    /// The slots of response bodies still open, each holding when it last handed the client a
    /// frame not yet taken (ms since `started` plus one; 0: not waiting for the client).
    responses: Mutex<Vec<Weak<AtomicU64>>>,
}

impl ConnectionActivity {
    pub fn new() -> ConnectionActivity {
        ConnectionActivity {
            started: Instant::now(),
            read: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            quiet_since_ms: AtomicU64::new(0),
            read_when_quiet: AtomicU64::new(0),
            write_blocked_since: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            responses: Mutex::new(Vec::new()),
        }
    }

    /// Milliseconds since the connection was accepted, plus one (so that 0 can mean "never").
    pub fn stamp(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    pub fn note_read(&self, bytes: usize) {
        self.read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A write to the socket would block (from now, unless it already did).
    pub fn note_write_blocked(&self) {
        if self.write_blocked_since.load(Ordering::Relaxed) == 0 {
            self.write_blocked_since
                .store(self.stamp(), Ordering::Relaxed);
        }
    }

    /// A write to the socket went through.
    pub fn note_written(&self) {
        if self.write_blocked_since.load(Ordering::Relaxed) != 0 {
            self.write_blocked_since.store(0, Ordering::Relaxed);
        }
    }

    pub fn note_http2(&self) {
        if !self.http2.load(Ordering::Relaxed) {
            self.http2.store(true, Ordering::Relaxed);
        }
    }

    /// One request handed to the service; it counts as open until the guard drops (with its
    /// response body, or with its future if it never answered).
    pub fn open_request(self: &Arc<Self>) -> RequestGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        RequestGuard {
            activity: Arc::clone(self),
        }
    }

    /// A slot for a response body to say when it is waiting for the client; it starts waiting
    /// (a response head sent, its first frame not yet taken).
    pub fn response_slot(&self) -> Arc<AtomicU64> {
        let slot = Arc::new(AtomicU64::new(self.stamp()));
        if let Ok(mut responses) = self.responses.lock() {
            // Between two looks of the clock a busy connection may answer many requests: the
            // slots of ended responses go here too, so the list stays as short as the open ones.
            if responses.len() >= PRUNE_AT {
                responses.retain(|slot| slot.strong_count() > 0);
            }
            responses.push(Arc::downgrade(&slot));
        }
        slot
    }

    /// A snapshot for the clock.
    pub fn snapshot(&self) -> Snapshot {
        let now = self.stamp();
        let mut oldest_waiting = None::<u64>;
        if let Ok(mut responses) = self.responses.lock() {
            responses.retain(|slot| match slot.upgrade() {
                Some(slot) => {
                    let since = slot.load(Ordering::Relaxed);
                    if since != 0 {
                        oldest_waiting = Some(oldest_waiting.map_or(since, |o| o.min(since)));
                    }
                    true
                }
                None => false,
            });
        }
        let blocked = self.write_blocked_since.load(Ordering::Relaxed);
        let stalled_since = match (blocked, oldest_waiting) {
            (0, waiting) => waiting,
            (blocked, Some(waiting)) => Some(blocked.min(waiting)),
            (blocked, None) => Some(blocked),
        };
        Snapshot {
            now,
            read: self.read.load(Ordering::Relaxed),
            open: self.open.load(Ordering::Acquire),
            quiet_since: self.quiet_since_ms.load(Ordering::Acquire),
            read_when_quiet: self.read_when_quiet.load(Ordering::Acquire),
            http2: self.http2.load(Ordering::Relaxed),
            stalled_since,
        }
    }
}

impl Default for ConnectionActivity {
    fn default() -> Self {
        ConnectionActivity::new()
    }
}

/// What the clock reads at one tick; times are [`ConnectionActivity::stamp`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub now: u64,
    pub read: u64,
    pub open: usize,
    pub quiet_since: u64,
    pub read_when_quiet: u64,
    pub http2: bool,
    /// Since when the oldest write to the client has been waiting, if one is.
    pub stalled_since: Option<u64>,
}

/// Keeps one request counted as open.
#[derive(Debug)]
pub struct RequestGuard {
    activity: Arc<ConnectionActivity>,
}

impl RequestGuard {
    pub fn activity(&self) -> &ConnectionActivity {
        &self.activity
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let activity = &self.activity;
        if activity.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            activity
                .read_when_quiet
                .store(activity.read.load(Ordering::Relaxed), Ordering::Release);
            activity
                .quiet_since_ms
                .store(activity.stamp(), Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_open_until_its_guard_drops_and_the_quiet_mark_takes_the_bytes_read() {
        let activity = Arc::new(ConnectionActivity::new());
        activity.note_read(10);
        let guard = activity.open_request();
        assert_eq!(activity.snapshot().open, 1);
        activity.note_read(5);
        drop(guard);
        let snapshot = activity.snapshot();
        assert_eq!(snapshot.open, 0);
        assert_eq!(snapshot.read_when_quiet, 15);
        assert!(snapshot.quiet_since >= 1);
    }

    #[test]
    fn the_oldest_response_waiting_for_the_client_is_the_stall() {
        let activity = ConnectionActivity::new();
        let first = activity.response_slot();
        let second = activity.response_slot();
        first.store(7, Ordering::Relaxed);
        second.store(3, Ordering::Relaxed);
        assert_eq!(activity.snapshot().stalled_since, Some(3));
        second.store(0, Ordering::Relaxed);
        assert_eq!(activity.snapshot().stalled_since, Some(7));
        drop(first);
        assert_eq!(activity.snapshot().stalled_since, None);
        activity.note_write_blocked();
        assert!(activity.snapshot().stalled_since.is_some());
        activity.note_written();
        assert_eq!(activity.snapshot().stalled_since, None);
    }
}
