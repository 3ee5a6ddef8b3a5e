//! The cross-replica gate over a backend's [`TurnStore`]: a key's turn is a lease in the store,
//! waited for until the store tells of its release (or by polling, where it cannot), renewed by
//! one keeper task while a forward outlasts half its hold, and cut (the upstream call or its
//! response dropped) before the lease can lapse, so a turn lapses only after its forward is over.
//! A lost store connection frees nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::body::ProxyBody;
use crate::store::StoreError;
use crate::store::{Renewal, TakeTurn, TurnFreed, TurnStore, WAITER_RETRY};

/// How often the keeper looks for leases to renew and forwards to cut.
const KEEPER_TICK: Duration = Duration::from_millis(200);
/// Longest one renewal round may take before the keeper gives up on it (and cuts what is due).
const RENEW_TIMEOUT: Duration = Duration::from_secs(2);
/// First and longest pause between two tries of a key another replica holds, where the store does
/// not tell of releases. Where it does, a waiter tries again when told, or after [`WAITER_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(2);
const LONGEST_RETRY: Duration = Duration::from_millis(50);

/// Why the cross-replica gate was not entered.
#[derive(Debug, thiserror::Error)]
pub enum CrossReplicaGateError {
    #[error("the key's gate stayed closed for {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

type Watches = DashMap<u64, Arc<TurnWatch>>;
/// Keys this replica waits for, each with what wakes its waiters when the store tells of a release.
type Waiting = DashMap<Box<str>, Arc<Notify>>;

pub struct CrossReplicaGate {
    turns: Arc<dyn TurnStore>,
    /// The next turn number of this replica.
    next_turn: AtomicU64,
    /// How much longer than its holder's deadline a lease lasts in the store.
    margin: Duration,
    watches: Arc<Watches>,
    keeper: tokio::task::JoinHandle<()>,
    waiting: Arc<Waiting>,
    /// The store tells of releases (waiters are woken, not polling).
    told: bool,
}

/// A key's turn, held. Dropping it releases the turn in the background.
pub struct CrossReplicaPass {
    watch: Arc<TurnWatch>,
    /// The key's mark as found once the turn was held (before the take's own advance).
    mark: Option<u64>,
    turns: Arc<dyn TurnStore>,
    watches: Arc<Watches>,
}

/// What the keeper knows of one held turn: when its holder's forward must be over, and the
/// response body to drop if the lease could not be renewed in time.
pub struct TurnWatch {
    key: String,
    turn: u64,
    /// How long after a take or renewal was sent its forward may go on.
    hold: Duration,
    lease: Duration,
    deadline: Mutex<Instant>,
    body: Mutex<Option<ProxyBody>>,
    lapsed: AtomicBool,
}

impl CrossReplicaGate {
    /// Starts the keeper on the calling runtime.
    pub fn new(turns: Arc<dyn TurnStore>, margin: Duration) -> CrossReplicaGate {
        let watches = Arc::new(Watches::new());
        let keeper = tokio::spawn(keep(Arc::clone(&turns), Arc::clone(&watches)));
        let waiting = Arc::new(Waiting::new());
        let woken = Arc::clone(&waiting);
        let freed: TurnFreed = Arc::new(move |key| {
            if let Some(notify) = woken.get(key) {
                notify.notify_waiters();
            }
        });
        let told = turns.tell_frees(freed);
        CrossReplicaGate {
            turns,
            next_turn: AtomicU64::new(1),
            margin,
            watches,
            keeper,
            waiting,
            told,
        }
    }

    /// Waits at most `wait` for the key's turn, for a forward that is over within `hold` of the
    /// take (the lease lasts `hold` plus the margin).
    pub async fn enter(
        &self,
        key: &str,
        wait: Duration,
        hold: Duration,
    ) -> Result<CrossReplicaPass, CrossReplicaGateError> {
        let entering = async {
            let waiter = Waiter::new(&self.waiting, key);
            // Asked and refused at least once: the store may have this replica queued.
            let mut queued = Queued {
                turns: self.turns.as_ref(),
                key,
                armed: false,
            };
            let mut pause = FIRST_RETRY;
            loop {
                // Listening before the take, so a release told between its answer and the wait
                // is not missed.
                let released = waiter.notify().notified();
                tokio::pin!(released);
                released.as_mut().enable();
                if let Some((pass, _)) = self.take(key, None, hold).await? {
                    queued.armed = false;
                    return Ok(pass);
                }
                queued.armed = true;
                if self.told {
                    let _ = tokio::time::timeout(WAITER_RETRY, released).await;
                } else {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_RETRY);
                }
            }
        };
        match tokio::time::timeout(wait, entering).await {
            Ok(entered) => entered,
            Err(_) => Err(CrossReplicaGateError::Timeout(wait)),
        }
    }

    /// Takes the key's turn if it is free and, in the same atomic step, compare-and-advances its
    /// mark to `token`: the pass and the mark the advance replaced. `None`: another replica holds
    /// the key and nothing was advanced.
    pub async fn try_enter_and_advance(
        &self,
        key: &str,
        token: u64,
        hold: Duration,
    ) -> Result<Option<(CrossReplicaPass, Option<u64>)>, StoreError> {
        self.take(key, Some(token), hold).await
    }

    /// One take under a new turn number. A take whose answer is lost (an error, or the caller
    /// went away) may have been made: its turn is released.
    async fn take(
        &self,
        key: &str,
        advance: Option<u64>,
        hold: Duration,
    ) -> Result<Option<(CrossReplicaPass, Option<u64>)>, StoreError> {
        let turn = self.next_turn.fetch_add(1, Ordering::Relaxed);
        let lease = hold + self.margin;
        let sent = Instant::now();
        let mut unanswered = Unanswered {
            turns: self.turns.as_ref(),
            key,
            turn,
            lease,
            armed: true,
        };
        let taken = self
            .turns
            .take(TakeTurn {
                key: key.to_owned(),
                turn,
                lease,
                advance,
            })
            .await?;
        unanswered.armed = false;
        let Some(mark) = taken else {
            return Ok(None);
        };
        let watch = Arc::new(TurnWatch {
            key: key.to_owned(),
            turn,
            hold,
            lease,
            deadline: Mutex::new(sent + hold),
            body: Mutex::new(None),
            lapsed: AtomicBool::new(false),
        });
        self.watches.insert(turn, Arc::clone(&watch));
        let pass = CrossReplicaPass {
            watch,
            mark,
            turns: Arc::clone(&self.turns),
            watches: Arc::clone(&self.watches),
        };
        Ok(Some((pass, mark)))
    }

    /// Stops the keeper and closes the turns (writing the releases held back).
    pub async fn close(&self) {
        self.keeper.abort();
        if let Err(error) = self.turns.close().await {
            tracing::warn!(%error, "closing the key turns failed; their leases will lapse");
        }
    }
}

impl Drop for CrossReplicaGate {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// A waiter of one key, woken when the store tells of its release; the key is forgotten when its
/// last waiter goes.
struct Waiter<'a> {
    waiting: &'a Waiting,
    key: &'a str,
    notify: Arc<Notify>,
}

impl<'a> Waiter<'a> {
    fn new(waiting: &'a Waiting, key: &'a str) -> Waiter<'a> {
        let notify = Arc::clone(waiting.entry(key.into()).or_default().value());
        Waiter {
            waiting,
            key,
            notify,
        }
    }

    fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        // The map's reference and this one: no other waiter of the key is left. (New waiters
        // clone under the same shard lock `remove_if` holds.)
        self.waiting
            .remove_if(self.key, |_, notify| Arc::strong_count(notify) == 2);
    }
}

/// Takes this replica out of the store's queue for a key when its waiting request gives up.
struct Queued<'a> {
    turns: &'a dyn TurnStore,
    key: &'a str,
    armed: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.turns.leave(self.key.to_owned());
        }
    }
}

/// Releases a take whose answer never came.
struct Unanswered<'a> {
    turns: &'a dyn TurnStore,
    key: &'a str,
    turn: u64,
    lease: Duration,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.turns
                .release(self.key.to_owned(), self.turn, self.lease);
        }
    }
}

impl CrossReplicaPass {
    /// The key's mark as read once the turn was held.
    pub fn mark_under_turn(&self) -> Option<u64> {
        self.mark
    }

    /// When the forward must be over (the lease lasts the margin longer), as first taken.
    pub fn deadline(&self) -> Instant {
        self.watch.deadline()
    }

    /// The watch that may cut the response body, once it is handed over.
    pub fn watch(&self) -> Arc<TurnWatch> {
        Arc::clone(&self.watch)
    }
}

impl Drop for CrossReplicaPass {
    fn drop(&mut self) {
        self.watches.remove(&self.watch.turn);
        self.turns
            .release(self.watch.key.clone(), self.watch.turn, self.watch.lease);
    }
}

impl TurnWatch {
    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Due for renewal: half its hold has gone by.
    fn renewal_due(&self, now: Instant) -> bool {
        now + self.hold / 2 >= self.deadline() && !self.lapsed()
    }

    fn renewed(&self, sent: Instant) {
        let mut deadline = self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        *deadline = (*deadline).max(sent + self.hold);
    }

    /// Hands the response body to the watch, which polls it for the [`GatedBody`]
    /// (`super::GatedBody`) and drops it if the turn runs out.
    pub fn hold_body(&self, body: ProxyBody) {
        if self.lapsed() {
            return;
        }
        *self.body.lock().unwrap_or_else(PoisonError::into_inner) = Some(body);
    }

    /// The body slot: `None` once the body ended or was cut.
    pub fn body(&self) -> std::sync::MutexGuard<'_, Option<ProxyBody>> {
        self.body.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the turn ran out before its forward ended (its body was dropped).
    pub fn lapsed(&self) -> bool {
        self.lapsed.load(Ordering::Acquire)
    }

    /// Drops the response body, and with it the upstream connection: the lease could not be
    /// renewed and is about to lapse.
    fn cut(&self) {
        if self.lapsed.swap(true, Ordering::AcqRel) {
            return;
        }
        let body = self.body().take();
        tracing::warn!(key = %self.key, turn = self.turn, "a key's turn could not be renewed in the store; its response is cut before the lease lapses");
        drop(body);
    }
}

/// The keeper: renews the leases of forwards that outlast half their hold, in one round for all
/// (run beside the keeper, so a store that hangs delays no cut), and cuts those whose holder's
/// deadline is near without a renewal.
async fn keep(turns: Arc<dyn TurnStore>, watches: Arc<Watches>) {
    let mut tick = tokio::time::interval(KEEPER_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut renewing: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let idle = renewing
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished);
        let due: Vec<Arc<TurnWatch>> = if idle {
            watches
                .iter()
                .filter(|w| w.renewal_due(now))
                .map(|w| Arc::clone(w.value()))
                .collect()
        } else {
            Vec::new()
        };
        if !due.is_empty() {
            renewing = Some(tokio::spawn(renew(Arc::clone(&turns), due)));
        }
        // Cut one tick early: the next look may come too late.
        let soon = Instant::now() + KEEPER_TICK;
        for watch in watches.iter() {
            if watch.deadline() <= soon {
                watch.cut();
            }
        }
    }
}

/// One renewal round: extends the deadline of each turn the store renewed.
async fn renew(turns: Arc<dyn TurnStore>, due: Vec<Arc<TurnWatch>>) {
    let sent = Instant::now();
    let renewals = due
        .iter()
        .map(|w| Renewal {
            key: w.key.clone(),
            turn: w.turn,
            lease: w.lease,
        })
        .collect();
    match tokio::time::timeout(RENEW_TIMEOUT, turns.renew(renewals)).await {
        Ok(Ok(renewed)) => {
            for (watch, renewed) in due.iter().zip(renewed) {
                if renewed {
                    watch.renewed(sent);
                }
            }
        }
        Ok(Err(error)) => tracing::warn!(%error, "renewing key turns failed"),
        Err(_) => tracing::warn!("renewing key turns timed out"),
    }
}
