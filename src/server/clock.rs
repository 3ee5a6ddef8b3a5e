//! When a client connection has overstayed its state: silent since it was accepted, idle between
//! requests, slow sending a head, or not reading its responses. One decision, taken on a
//! [`Snapshot`] of its [`ConnectionActivity`](super::activity::ConnectionActivity) at each tick.

use std::time::Duration;

use super::activity::Snapshot;
use crate::config::ServerConfig;

/// The connection timeouts of `[server]` (the admin listener uses them too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionTimeouts {
    pub first_byte: Duration,
    pub idle: Duration,
    pub head: Duration,
    pub write: Duration,
}

/// Bounds of the clock's tick: fine enough for timeouts of a second, coarse enough that an idle
/// connection costs one timer wake-up a second at most.
const MIN_TICK: Duration = Duration::from_millis(10);
const MAX_TICK: Duration = Duration::from_secs(1);

impl ConnectionTimeouts {
    pub fn from_config(server: &ServerConfig) -> ConnectionTimeouts {
        ConnectionTimeouts {
            first_byte: server.first_byte_timeout,
            idle: server.idle_timeout,
            head: server.head_timeout,
            write: server.write_timeout,
        }
    }

    /// How often a connection's clock looks: a quarter of the shortest timeout, so each closes
    /// within a quarter of its length of being due.
    pub fn tick(&self) -> Duration {
        let shortest = self
            .first_byte
            .min(self.idle)
            .min(self.head)
            .min(self.write);
        (shortest / 4).clamp(MIN_TICK, MAX_TICK)
    }
}

/// Why a connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Not one byte within `first_byte_timeout`.
    Silent,
    /// No request within `idle_timeout` of the last one (HTTP/2: no open stream).
    Idle,
    /// A head (or the HTTP/2 preface) not complete within `head_timeout` of its first byte.
    SlowHead,
    /// A response the client did not read for `write_timeout`.
    NotReading,
}

impl Expiry {
    /// The label of the closed-connections metric.
    pub fn label(self) -> &'static str {
        match self {
            Expiry::Silent => "silent",
            Expiry::Idle => "idle",
            Expiry::SlowHead => "slow-head",
            Expiry::NotReading => "not-reading",
        }
    }
}

/// One connection's clock: the timeouts, and where the head being read started.
#[derive(Debug)]
pub struct ConnectionClock {
    timeouts: ConnectionTimeouts,
    /// The bytes-read mark of the quiet spell in which a head began, and when it was seen.
    head_began: Option<(u64, u64)>,
}

impl ConnectionClock {
    pub fn new(timeouts: ConnectionTimeouts) -> ConnectionClock {
        ConnectionClock {
            timeouts,
            head_began: None,
        }
    }

    /// Whether the connection is due to close at `snapshot`.
    pub fn check(&mut self, snapshot: Snapshot) -> Option<Expiry> {
        let over = |since: u64, limit: Duration| {
            u128::from(snapshot.now.saturating_sub(since)) >= limit.as_millis()
        };
        if let Some(since) = snapshot.stalled_since {
            if over(since, self.timeouts.write) {
                return Some(Expiry::NotReading);
            }
        }
        if snapshot.open > 0 {
            self.head_began = None;
            return None;
        }
        if snapshot.read == 0 {
            return over(1, self.timeouts.first_byte).then_some(Expiry::Silent);
        }
        // HTTP/2 frames between streams (pings, settings, a half-sent head) keep nothing open.
        if snapshot.http2 || snapshot.read == snapshot.read_when_quiet {
            self.head_began = None;
            let since = snapshot.quiet_since.max(1);
            return over(since, self.timeouts.idle).then_some(Expiry::Idle);
        }
        let began = match self.head_began {
            Some((mark, at)) if mark == snapshot.read_when_quiet => at,
            _ => {
                self.head_began = Some((snapshot.read_when_quiet, snapshot.now));
                snapshot.now
            }
        };
        over(began, self.timeouts.head).then_some(Expiry::SlowHead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeouts() -> ConnectionTimeouts {
        ConnectionTimeouts {
            first_byte: Duration::from_millis(100),
            idle: Duration::from_millis(1000),
            head: Duration::from_millis(300),
            write: Duration::from_millis(500),
        }
    }

    fn at(now: u64) -> Snapshot {
        Snapshot {
            now,
            read: 0,
            open: 0,
            quiet_since: 0,
            read_when_quiet: 0,
            http2: false,
            stalled_since: None,
        }
    }

    #[test]
    fn a_silent_connection_closes_after_the_first_byte_timeout() {
        let mut clock = ConnectionClock::new(timeouts());
        assert_eq!(clock.check(at(50)), None);
        assert_eq!(clock.check(at(101)), Some(Expiry::Silent));
    }

    #[test]
    fn a_head_begun_closes_after_the_head_timeout_from_when_it_was_seen() {
        let mut clock = ConnectionClock::new(timeouts());
        let reading = |now| Snapshot { read: 3, ..at(now) };
        assert_eq!(clock.check(reading(50)), None);
        assert_eq!(clock.check(reading(300)), None);
        assert_eq!(clock.check(reading(350)), Some(Expiry::SlowHead));
    }

    #[test]
    fn a_kept_alive_connection_closes_after_the_idle_timeout_from_its_last_response() {
        let mut clock = ConnectionClock::new(timeouts());
        let quiet = |now| Snapshot {
            read: 80,
            read_when_quiet: 80,
            quiet_since: 200,
            ..at(now)
        };
        assert_eq!(clock.check(quiet(1100)), None);
        assert_eq!(clock.check(quiet(1200)), Some(Expiry::Idle));
    }

    #[test]
    fn an_open_request_keeps_the_connection_unless_the_client_stops_reading() {
        let mut clock = ConnectionClock::new(timeouts());
        let busy = |now, stalled_since| Snapshot {
            read: 80,
            open: 1,
            stalled_since,
            ..at(now)
        };
        assert_eq!(clock.check(busy(10_000, None)), None);
        assert_eq!(clock.check(busy(10_000, Some(9_600))), None);
        assert_eq!(
            clock.check(busy(10_000, Some(9_500))),
            Some(Expiry::NotReading)
        );
    }

    #[test]
    fn http2_frames_without_a_stream_do_not_keep_a_connection_open() {
        let mut clock = ConnectionClock::new(timeouts());
        let pinging = |now, read| Snapshot {
            read,
            read_when_quiet: 24,
            http2: true,
            ..at(now)
        };
        assert_eq!(clock.check(pinging(500, 100)), None);
        assert_eq!(clock.check(pinging(1001, 200)), Some(Expiry::Idle));
    }
}
