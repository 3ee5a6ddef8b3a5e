//! Batched cross-replica key locks: one PostgreSQL session holds the advisory locks of many keys
//! at once. Entries and releases queued while a statement runs go together in the next one (a
//! plain statement when every entry advances, else the function `fencegate_gate_batch`, migration
//! 0004), so an uncontended key costs a share of one statement instead of a connection and two
//! round trips of its own. Each lock taken comes with its key's mark as found under the lock; an
//! entry with a token also compare-and-advances the key's mark in that statement. A key held by
//! another session is not waited for here: the caller then waits on a dedicated connection.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::ConnectOptions as _;
use tokio::sync::{mpsc, oneshot, Mutex};

use crate::store::per_thread::TaskQueue;
use crate::store::{decode_postgres_mark, encode_postgres_mark, StoreError};

const BACKEND: &str = "postgres";
/// Longest a connect or one batch's statement may take; past it the session is given up.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most entries and releases in one statement.
const MAX_BATCH: usize = 1024;

/// One holder session's queue. Cloning shares the session.
#[derive(Clone)]
pub struct LockHolder {
    commands: mpsc::UnboundedSender<Command>,
}

impl TaskQueue for LockHolder {
    /// Whether the holder's task has ended (its runtime did).
    fn is_closed(&self) -> bool {
        self.commands.is_closed()
    }
}

/// The locks the holders of one gateway hold (taken, release not yet run), and which holder
/// holds each; kept by the holders, read to send an entry where its key's lock already is.
pub type Holding = DashMap<i64, LockHolder>;

enum Command {
    Lock {
        lock: i64,
        key: String,
        /// The token to advance the key's mark to once the lock is taken (stored encoding).
        advance: Option<i64>,
        reply: Reply,
    },
    Unlock {
        lock: i64,
        session: u64,
    },
}

/// A lock taken, and its key's mark as found under it, before the entry's own advance if it asked
/// for one (`None`: the key had no mark).
pub struct Taken {
    pub lock: HeldLock,
    pub mark: Option<u64>,
}

/// A key's lock, held by a holder session. Dropping it queues the release; the session stays
/// open while any of its locks is held, even after the holder gave it up for a new one.
pub struct HeldLock {
    lock: i64,
    session: Arc<Session>,
    commands: mpsc::UnboundedSender<Command>,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        // After a send error the holder task is gone; the session closes with the last lock.
        let _ = self.commands.send(Command::Unlock {
            lock: self.lock,
            session: self.session.id,
        });
    }
}

/// A holder's connection. Dropped (and with it the connection, which ends the PostgreSQL session
/// and frees every lock it held) when neither the holder nor any held lock needs it.
struct Session {
    id: u64,
    connection: Mutex<PgConnection>,
}

impl LockHolder {
    /// Starts a holder task on the calling runtime; it connects on its first batch and records
    /// the locks it takes and releases in `holding`.
    pub fn start(options: PgConnectOptions, holding: Arc<Holding>) -> LockHolder {
        let (commands, receiver) = mpsc::unbounded_channel();
        let task = HolderTask {
            options,
            postponed: Vec::new(),
            current: None,
            sessions: 0,
            commands: commands.clone(),
            holding,
        };
        tokio::spawn(task.run(receiver));
        LockHolder { commands }
    }

    /// Takes `lock` if no other session holds it and reads the mark of `key` after taking it,
    /// then, with `advance`, raises that mark to the token (durable when this returns): `Some`
    /// lock and mark found, or `None` if the lock is held elsewhere (and nothing was advanced).
    /// Dropping the wait is safe: a lock taken for a caller that went away is released (its
    /// advance, if made, stands, as one whose forward failed would).
    pub async fn try_lock(
        &self,
        lock: i64,
        key: &str,
        advance: Option<u64>,
    ) -> Result<Option<Taken>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let key = key.to_owned();
        let advance = advance.map(encode_postgres_mark);
        self.commands
            .send(Command::Lock {
                lock,
                key,
                advance,
                reply,
            })
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

struct HolderTask {
    options: PgConnectOptions,
    /// Entries of a key already in the batch being built, kept for the next one: a statement
    /// advances each key at most once.
    postponed: Vec<Command>,
    current: Option<Arc<Session>>,
    /// Sessions connected so far: the next one's id.
    sessions: u64,
    /// For the locks it hands out.
    commands: mpsc::UnboundedSender<Command>,
    holding: Arc<Holding>,
}

impl HolderTask {
    async fn run(mut self, mut receiver: mpsc::UnboundedReceiver<Command>) {
        let mut batch = Vec::new();
        loop {
            if self.postponed.is_empty() {
                if receiver.recv_many(&mut batch, MAX_BATCH).await == 0 {
                    return;
                }
            } else {
                // Postponed entries first, with whatever else is queued now; no waiting.
                batch.append(&mut self.postponed);
                while batch.len() < MAX_BATCH {
                    match receiver.try_recv() {
                        Ok(command) => batch.push(command),
                        Err(_) => break,
                    }
                }
            }
            self.process(std::mem::take(&mut batch)).await;
        }
    }

    async fn process(&mut self, batch: Vec<Command>) {
        let mut locks = Vec::new();
        let mut keys = Vec::new();
        let mut advances = Vec::new();
        let mut replies = Vec::new();
        let mut entered = HashSet::new();
        let mut unlocks = Vec::new();
        for command in batch {
            match command {
                // Another entry of the key (one whose caller gave up, and the next request's):
                // the next batch takes it.
                Command::Lock { lock, .. } if !entered.insert(lock) => {
                    self.postponed.push(command);
                }
                Command::Lock {
                    lock,
                    key,
                    advance,
                    reply,
                } => {
                    locks.push(lock);
                    keys.push(key);
                    advances.push(advance);
                    replies.push(reply);
                }
                // A session given up releases its locks when it closes.
                Command::Unlock { lock, session } => {
                    if self.current.as_ref().is_some_and(|s| s.id == session) {
                        unlocks.push(lock);
                    } else {
                        self.forget(lock);
                    }
                }
            }
        }
        if locks.is_empty() && unlocks.is_empty() {
            return;
        }
        let session = match self.session().await {
            Ok(session) => session,
            Err(source) => return fail(replies, &source),
        };
        let ran = tokio::time::timeout(
            STATEMENT_TIMEOUT,
            run_batch(&session, &unlocks, &locks, &keys, &advances),
        )
        .await;
        let taken = match ran {
            Ok(Ok(taken)) if taken.len() == locks.len() => taken,
            failed => {
                // The session's state is unknown: give it up. Locks it still holds for passes
                // in flight stay held until those passes end and the session closes.
                tracing::warn!(result = ?failed.map(|r| r.map(|t| t.len())), "the gate's lock session failed; reconnecting");
                self.current = None;
                let source: Failure =
                    Arc::new(std::io::Error::other("the gate's lock session failed"));
                return fail(replies, &source);
            }
        };
        for lock in unlocks {
            self.forget(lock);
        }
        for (lock, (taken, _)) in locks.iter().zip(&taken) {
            if *taken {
                let holder = LockHolder {
                    commands: self.commands.clone(),
                };
                self.holding.insert(*lock, holder);
            }
        }
        for ((lock, reply), (taken, mark)) in locks.into_iter().zip(replies).zip(taken) {
            let held = taken.then(|| Taken {
                lock: HeldLock {
                    lock,
                    session: Arc::clone(&session),
                    commands: self.commands.clone(),
                },
                mark: mark.map(decode_postgres_mark),
            });
            // If the caller went away, the returned lock is dropped here, which queues its
            // release for the next batch.
            let _ = reply.send(Ok(held));
        }
    }

    /// Drops `lock` from `holding` if this holder is the one recorded there.
    fn forget(&self, lock: i64) {
        self.holding.remove_if(&lock, |_, holder| {
            holder.commands.same_channel(&self.commands)
        });
    }

    /// The current session, connecting a new one if there is none.
    async fn session(&mut self) -> Result<Arc<Session>, Failure> {
        if let Some(session) = &self.current {
            return Ok(Arc::clone(session));
        }
        let connection = match tokio::time::timeout(STATEMENT_TIMEOUT, self.options.connect()).await
        {
            Ok(Ok(connection)) => connection,
            Ok(Err(source)) => return Err(Arc::new(source)),
            Err(_) => {
                return Err(Arc::new(std::io::Error::other(
                    "connecting the gate's lock session timed out",
                )))
            }
        };
        let session = Arc::new(Session {
            id: self.sessions,
            connection: Mutex::new(connection),
        });
        self.sessions += 1;
        self.current = Some(Arc::clone(&session));
        Ok(session)
    }
}

/// Why a batch failed, shared by every entry in it.
type Failure = Arc<dyn std::error::Error + Send + Sync>;

type Reply = oneshot::Sender<Result<Option<Taken>, StoreError>>;

fn fail(replies: Vec<Reply>, source: &Failure) {
    for reply in replies {
        let _ = reply.send(Err(StoreError::Backend {
            backend: BACKEND,
            source: Arc::clone(source),
        }));
    }
}

/// Releases `unlocks`, then tries `locks`, in one statement; returns, per lock in order, whether
/// it was taken and, if it was, the stored mark of its key in `keys` as found under the lock,
/// before the entry's advance to its token in `advances`, if any. A session's advisory locks count
/// re-entries, so a key released and taken again by the same session in one batch ends up held
/// once.
async fn run_batch(
    session: &Session,
    unlocks: &[i64],
    locks: &[i64],
    keys: &[String],
    advances: &[Option<i64>],
) -> Result<Vec<(bool, Option<i64>)>, sqlx::Error> {
    let mut connection = session.connection.lock().await;
    let tokens: Option<Vec<i64>> = advances.iter().copied().collect();
    if let Some(tokens) = tokens.filter(|t| !t.is_empty()) {
        return sqlx::query_as(RELEASE_LOCK_AND_ADVANCE_SQL)
            .bind(unlocks)
            .bind(locks)
            .bind(keys)
            .bind(tokens)
            .fetch_all(&mut *connection)
            .await;
    }
    sqlx::query_as("SELECT taken, mark FROM fencegate_gate_batch($1, $2, $3, $4) ORDER BY n")
        .bind(unlocks)
        .bind(locks)
        .bind(keys)
        .bind(advances)
        .fetch_all(&mut *connection)
        .await
}

/// A batch whose every entry advances, in one plain statement (no function call): release,
/// then try each lock (its argument depends on the releases' count, so no lock is tried before
/// every release ran), then compare-and-advance the keys whose locks were taken. The advance
/// updates the newest version of each row whatever the statement's snapshot, so it needs none
/// of the function's fresh snapshots, which only lock-only entries' reads do.
const RELEASE_LOCK_AND_ADVANCE_SQL: &str = "
WITH released AS (
    SELECT count(pg_advisory_unlock(u.id)) AS n FROM unnest($1::bigint[]) AS u(id)
), entry AS (
    SELECT e.i, e.k, e.t, pg_try_advisory_lock(e.id + 0 * released.n) AS held
    FROM released, unnest($2::bigint[], $3::text[], $4::bigint[]) WITH ORDINALITY AS e(id, k, t, i)
), advanced AS (
    INSERT INTO fence_marks AS m (key, mark, previous_mark)
    SELECT entry.k, entry.t, NULL FROM entry WHERE entry.held ORDER BY entry.k
    ON CONFLICT (key) DO UPDATE
        SET previous_mark = m.mark, mark = GREATEST(m.mark, excluded.mark)
    RETURNING m.key AS k, m.previous_mark AS previous
)
SELECT entry.held, advanced.previous
FROM entry LEFT JOIN advanced ON advanced.k = entry.k
ORDER BY entry.i";
