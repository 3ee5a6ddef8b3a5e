//! Releases of PostgreSQL key turns, written only when another replica wants the key. A turn whose
//! forward ended is kept here as *ended*: its row still names this replica, which takes it back at
//! once, and it lapses by its lease. A replica whose take finds a key held notifies the holder
//! (`pg_notify` on [`CHANNEL`], in the take's own statement, at every try); the holder's listener
//! then has the release written. While the listener is not connected, or too many turns have
//! ended unwritten, releases are written at once, and every reconnect writes those left ended.
//! The same listener hears of keys released while some replica waits ([`FREE_CHANNEL`]) and
//! wakes this replica's waiters of those keys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use crate::store::turns::TurnFreed;

/// The channel the take statements notify on: payload `"{holder} {key}"`.
pub(super) const CHANNEL: &str = "fencegate_turns";
/// The channel releases of keys someone waits for are told on (migration 0006): payload the key.
/// Channels are the database's, not the schema's: a key of another schema wakes a waiter for
/// nothing but one more try.
pub(super) const FREE_CHANNEL: &str = "fencegate_turn_free";
/// Most ended turns kept unwritten; past it releases are written at once.
const MAX_ENDED: usize = 100_000;
/// How long the listener waits for a notification before it forgets lapsed entries.
const PRUNE_EVERY: Duration = Duration::from_secs(1);
/// How long the listener's connection may take to answer a ping before it is replaced.
const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// How long after a failed connect the listener tries again.
const RECONNECT_AFTER: Duration = Duration::from_millis(200);

pub(super) struct TurnWants {
    holder: Arc<str>,
    /// Turns whose forward ended, by key: the turn, and when its lease has certainly lapsed.
    ended: DashMap<String, (u64, Instant)>,
    /// Keys another replica asked for whose turn had not ended yet here, and since when.
    wanted: DashMap<String, Instant>,
    /// The listener is connected and listening: releases may wait for a want.
    listening: AtomicBool,
    started: AtomicBool,
    /// Closed: releases are written at once.
    closed: AtomicBool,
    /// The longest lease seen, in milliseconds: wants older than it are forgotten.
    longest_ms: AtomicU64,
    /// Wakes this replica's waiters of a key released elsewhere.
    freed: OnceLock<TurnFreed>,
}

/// What the listener has written: each `(key, turn)` to release now.
pub(super) type ReleaseNow = Arc<dyn Fn(String, u64) + Send + Sync>;

impl TurnWants {
    pub(super) fn new(holder: Arc<str>) -> TurnWants {
        TurnWants {
            holder,
            ended: DashMap::new(),
            wanted: DashMap::new(),
            listening: AtomicBool::new(false),
            started: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            longest_ms: AtomicU64::new(0),
            freed: OnceLock::new(),
        }
    }

    /// Has `freed` called for each key released while some replica waits (the first one given).
    pub(super) fn tell_frees(&self, freed: TurnFreed) {
        let _ = self.freed.set(freed);
    }

    /// Another replica waits for `key`, just taken here: its release is written when it ends.
    pub(super) fn wanted_now(&self, key: &str) {
        self.wanted.insert(key.to_owned(), Instant::now());
    }

    /// Whether the listener has been started.
    pub(super) fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    /// Starts the listener on the calling runtime, once; `release` writes a release.
    pub(super) fn start(self: &Arc<Self>, options: &PgConnectOptions, release: ReleaseNow) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(listen(Arc::clone(self), options.clone(), release));
    }

    /// Whether the release of `turn` of `key` (leased for `lease`) may wait for a want; `false`:
    /// write it now.
    pub(super) fn defer(&self, key: &str, turn: u64, lease: Duration) -> bool {
        if !self.listening.load(Ordering::Acquire)
            || self.closed.load(Ordering::Acquire)
            || self.ended.len() >= MAX_ENDED
        {
            return false;
        }
        if self.wanted.remove(key).is_some() {
            return false;
        }
        let millis = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self.longest_ms.fetch_max(millis, Ordering::Relaxed);
        self.ended
            .insert(key.to_owned(), (turn, Instant::now() + lease));
        // A want that came in between: it saw no ended turn, so this side writes.
        if self.wanted.remove(key).is_some() {
            return self.ended.remove_if(key, |_, (t, _)| *t == turn).is_none();
        }
        true
    }

    /// Another replica wants `key`: the turn to release now, if it has ended here.
    fn want(&self, key: &str) -> Option<u64> {
        self.wanted.insert(key.to_owned(), Instant::now());
        let (_, (turn, _)) = self.ended.remove(key)?;
        self.wanted.remove(key);
        Some(turn)
    }

    /// From now on no release waits; every ended turn, to write now.
    pub(super) fn close(&self) -> Vec<(String, u64)> {
        self.closed.store(true, Ordering::Release);
        self.drain()
    }

    /// Every ended turn, to write now.
    fn drain(&self) -> Vec<(String, u64)> {
        let keys: Vec<String> = self.ended.iter().map(|e| e.key().clone()).collect();
        keys.into_iter()
            .filter_map(|key| self.ended.remove(&key).map(|(key, (turn, _))| (key, turn)))
            .collect()
    }

    /// Forgets ended turns whose lease has lapsed and wants older than any lease.
    fn prune(&self) {
        let longest_lease = Duration::from_millis(self.longest_ms.load(Ordering::Relaxed))
            .max(Duration::from_secs(60));
        let now = Instant::now();
        self.ended.retain(|_, (_, until)| *until > now);
        self.wanted
            .retain(|_, since| now.duration_since(*since) < longest_lease);
    }
}

/// The listener: notifications for this holder release ended turns; each (re)connect first
/// writes the releases a lost notification may have held up.
async fn listen(wants: Arc<TurnWants>, options: PgConnectOptions, release: ReleaseNow) {
    let prefix = format!("{} ", wants.holder);
    loop {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(options.clone());
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(%error, "the key-turn listener could not connect");
                tokio::time::sleep(RECONNECT_AFTER).await;
                continue;
            }
        };
        if let Err(error) = listener.listen_all([CHANNEL, FREE_CHANNEL]).await {
            tracing::debug!(%error, "the key-turn listener could not listen");
            tokio::time::sleep(RECONNECT_AFTER).await;
            continue;
        }
        loop {
            // Listening (again): whatever ended meanwhile may have been wanted unheard.
            wants.listening.store(true, Ordering::Release);
            for (key, turn) in wants.drain() {
                release(key, turn);
            }
            let lost = loop {
                match tokio::time::timeout(PRUNE_EVERY, listener.try_recv()).await {
                    Err(_) => {
                        wants.prune();
                        // A connection that stalled delivers nothing and reports nothing: ask it.
                        let ping = sqlx::query("SELECT 1").execute(&mut listener);
                        if !matches!(tokio::time::timeout(PING_TIMEOUT, ping).await, Ok(Ok(_))) {
                            tracing::debug!("the key-turn listener stopped answering");
                            break true;
                        }
                    }
                    Ok(Ok(Some(notification))) if notification.channel() == FREE_CHANNEL => {
                        if let Some(freed) = wants.freed.get() {
                            freed(notification.payload());
                        }
                    }
                    Ok(Ok(Some(notification))) => {
                        let Some(key) = notification.payload().strip_prefix(&prefix) else {
                            continue;
                        };
                        if let Some(turn) = wants.want(key) {
                            release(key.to_owned(), turn);
                        }
                    }
                    // The connection was lost; the listener reconnects on the next call.
                    Ok(Ok(None)) => break false,
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "the key-turn listener failed");
                        break true;
                    }
                }
            };
            wants.listening.store(false, Ordering::Release);
            for (key, turn) in wants.drain() {
                release(key, turn);
            }
            if lost {
                break;
            }
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}
