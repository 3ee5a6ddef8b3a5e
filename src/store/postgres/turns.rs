//! Key turns on PostgreSQL: columns of each key's `fence_marks` row (migration 0005), taken,
//! released and renewed by one holder task per serving thread, each on a connection of its own.
//! Takes and releases queued while a statement runs go together in the next one, which may also
//! compare-and-advance each key's mark under the turn it takes (in the same row update), so an
//! uncontended serialized write costs a share of one statement. Replicas that find a key held
//! queue for it in `fence_turn_waiters` (migration 0006) and are served in order; every statement
//! locks its keys' rows first, in one order (migration 0007). A failed statement frees nothing:
//! the turns it held stay leased.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::ConnectOptions as _;
use tokio::sync::{mpsc, oneshot};

use super::codec::{decode_mark, encode_mark};
use super::known_rows::KnownRows;
use super::turn_wants::{ReleaseNow, TurnWants};
use super::BACKEND;
use crate::store::expected::{mismatch_reason, ExpectedIdentity};
use crate::store::plumbing::inbox::Inbox;
use crate::store::plumbing::per_thread::{PerThread, TaskQueue};
use crate::store::turns::{Renewal, TakeTurn, TurnFreed, TurnStore, WAITER_RETRY};
use crate::store::{StoreError, StoreFuture};

/// Longest a connect or one batch's statement may take; past it the connection is given up.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most takes and releases in one statement.
const MAX_BATCH: usize = 1024;
/// One take's row: whether the turn was taken, the mark found, and whether another replica waits
/// for the key.
type TakeRow = (bool, Option<i64>, bool);
/// One row of [`TAKE_AND_ADVANCE_SQL`]: taken, the mark found, the identity held, every row locked
/// (all made), the key's row created by this statement, another replica waits.
type PlainRow = (bool, Option<i64>, bool, bool, bool, bool);
/// Most statements one plain batch is sent in: the rows a statement could not lock exist when it
/// ends, so the next one's snapshot holds them.
const MAX_PLAIN_TRIES: usize = 4;
/// One batch statement's rows, or `None` for a store whose identity record is not the adopted one.
type BatchFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<Vec<TakeRow>>, sqlx::Error>> + Send + 'a>,
>;

/// A batch whose every take advances, in one plain statement (no plpgsql call): release, then
/// take each key's turn and compare-and-advance its mark in one update of its row, only where the
/// turn is free and no other replica waits ahead (`fencegate_turn_waiting`, migration 0007, read
/// once for the whole batch). The update works on the newest version of each row whatever the
/// statement's snapshot, so it needs none of the function's fresh snapshots, which only the reads
/// of takes without a token do. With `$2`, nothing happens unless the store's identity record
/// holds it, and every row says so (`ok` false). Keys released must not be taken in the same
/// statement. As in `fencegate_turn_batch`: an own turn that is over, of a key another replica
/// waits ahead for, is released (yielded); a take not made enqueues this holder as a waiter and
/// notifies the key's holder that this replica wants it (`turn_wants.rs`); a take made leaves the
/// queue; a key released while others wait is announced on the free channel; and each row says
/// whether another replica waits for a key taken. `$9`: how long a waiter not seen still counts,
/// in milliseconds. `$10`: whether a key may lack its row (false skips the creations' lookups).
///
/// No deadlock between batches: before it locks anything, the statement creates the rows of the
/// keys its snapshot lacks, in one (bytewise) order, each taken and advanced at once (`created`:
/// a key without a row has no holder and no waiters), waiting for any other batch creating one
/// of them; then `locked` locks the rows of every other key named, in the same order, as the
/// function does. A row another batch created after this statement's snapshot could only be
/// locked later, out of order: unless every key's row is created or locked (`go`), nothing but
/// the creations is done, and every row says so (`go` false; `created` for the keys created):
/// the other takes and the releases are sent again, in a statement whose snapshot holds the rows.
const TAKE_AND_ADVANCE_SQL: &str = "
WITH ident AS (
    SELECT $2::text IS NULL OR EXISTS (
        SELECT 1 FROM fencegate_meta WHERE name = 'store_id' AND value = $2::text) AS ok,
        clock_timestamp() - $9::bigint * interval '1 millisecond' AS fresh_since
), created AS (
    INSERT INTO fence_marks AS f (key, mark, previous_mark, turn_holder, turn, turn_expires)
    SELECT e.k, e.t, NULL, $1, e.turn, clock_timestamp() + e.l * interval '1 millisecond'
    FROM unnest($5::text[], $6::bigint[], $7::bigint[], $8::bigint[]) AS e(k, turn, l, t), ident
    WHERE $10::boolean AND ident.ok
        AND NOT EXISTS (SELECT 1 FROM fence_marks AS m WHERE m.key = e.k)
    ORDER BY e.k COLLATE \"C\"
    ON CONFLICT (key) DO NOTHING
    RETURNING f.key
), locked AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM fence_marks
        WHERE key = ANY($3::text[] || $5::text[]) AND (SELECT count(*) FROM created) >= 0
        ORDER BY key COLLATE \"C\"
        FOR UPDATE) AS rows
), go AS (
    SELECT ident.ok AND locked.n + (SELECT count(*) FROM created) = (
        SELECT count(DISTINCT k) FROM unnest($3::text[] || $5::text[]) AS k) AS go
    FROM ident, locked
), released AS (
    UPDATE fence_marks AS f SET turn_expires = '-infinity'
    FROM unnest($3::text[], $4::bigint[]) AS r(k, t), go
    WHERE go.go AND f.key = r.k AND f.turn_holder = $1 AND f.turn = r.t
    RETURNING f.key
), waiting AS (
    SELECT w.key, w.ahead
    FROM ident, fencegate_turn_waiting($3::text[] || $5::text[], $1, ident.fresh_since) AS w
), ahead AS (
    SELECT e.k FROM unnest($5::text[]) AS e(k)
    WHERE EXISTS (SELECT 1 FROM waiting AS w WHERE w.key = e.k AND w.ahead)
), yielded AS (
    UPDATE fence_marks AS f SET turn_expires = '-infinity'
    FROM ahead, go
    WHERE go.go AND f.key = ahead.k AND f.turn_holder = $1
        AND f.turn_expires > clock_timestamp()
    RETURNING f.key
), took AS (
    INSERT INTO fence_marks AS f (key, mark, previous_mark, turn_holder, turn, turn_expires)
    SELECT e.k, e.t, NULL, $1, e.turn, clock_timestamp() + e.l * interval '1 millisecond'
    FROM unnest($5::text[], $6::bigint[], $7::bigint[], $8::bigint[]) AS e(k, turn, l, t), go
    WHERE go.go AND NOT EXISTS (SELECT 1 FROM ahead WHERE ahead.k = e.k)
        AND NOT EXISTS (SELECT 1 FROM created WHERE created.key = e.k)
    ORDER BY e.k COLLATE \"C\"
    ON CONFLICT (key) DO UPDATE
        SET previous_mark = f.mark, mark = GREATEST(f.mark, excluded.mark),
            turn_holder = excluded.turn_holder, turn = excluded.turn,
            turn_expires = excluded.turn_expires
        WHERE f.turn_expires IS NULL OR f.turn_expires <= clock_timestamp()
            OR f.turn_holder = excluded.turn_holder
    RETURNING f.key, f.previous_mark
), left_queue AS (
    DELETE FROM fence_turn_waiters AS w USING took
    WHERE w.key = took.key AND w.holder = $1
), queued AS (
    INSERT INTO fence_turn_waiters AS w (key, holder, enqueued, seen)
    SELECT e.k, $1, clock_timestamp(), clock_timestamp()
    FROM unnest($5::text[]) AS e(k), go
    WHERE go.go AND NOT EXISTS (SELECT 1 FROM took WHERE took.key = e.k)
        AND NOT EXISTS (SELECT 1 FROM created WHERE created.key = e.k)
    ORDER BY e.k COLLATE \"C\"
    ON CONFLICT (key, holder) DO UPDATE
        SET seen = excluded.seen,
            enqueued = CASE WHEN w.seen > (SELECT fresh_since FROM ident) THEN w.enqueued
                ELSE excluded.enqueued END
), wants AS (
    SELECT count(pg_notify('fencegate_turns', f.turn_holder || ' ' || f.key)) AS n
    FROM unnest($5::text[]) AS e(k) JOIN fence_marks AS f ON f.key = e.k, go
    WHERE go.go AND f.turn_holder IS DISTINCT FROM $1 AND f.turn_expires > clock_timestamp()
        AND NOT EXISTS (SELECT 1 FROM took WHERE took.key = e.k)
), frees AS (
    SELECT count(pg_notify('fencegate_turn_free', r.key)) AS n
    FROM (SELECT key FROM released UNION SELECT key FROM yielded) AS r
    WHERE EXISTS (SELECT 1 FROM waiting AS w WHERE w.key = r.key)
)
SELECT created.key IS NOT NULL OR took.key IS NOT NULL, took.previous_mark, ident.ok, go.go,
    created.key IS NOT NULL,
    took.key IS NOT NULL AND EXISTS (SELECT 1 FROM waiting AS w WHERE w.key = e.k)
FROM unnest($5::text[]) WITH ORDINALITY AS e(k, i)
    CROSS JOIN ident
    CROSS JOIN go
    CROSS JOIN wants
    CROSS JOIN frees
    LEFT JOIN created ON created.key = e.k
    LEFT JOIN took ON took.key = e.k
ORDER BY e.i";

/// The releases of a replica that closes: its turns that are over, each announced on the free
/// channel where another replica waits. The rows are locked first, in the batches' order.
const CLOSE_RELEASE_SQL: &str = "
WITH locked AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM fence_marks
        WHERE key = ANY($2::text[])
        ORDER BY key COLLATE \"C\"
        FOR UPDATE) AS rows
), released AS (
    UPDATE fence_marks AS f SET turn_expires = '-infinity'
    FROM unnest($2::text[], $3::bigint[]) AS r(k, t), locked
    WHERE f.key = r.k AND f.turn_holder = $1 AND f.turn = r.t
    RETURNING f.key
)
SELECT count(pg_notify('fencegate_turn_free', w.key))
FROM (SELECT array_agg(key) AS keys FROM released) AS r,
    fencegate_turn_waiting(r.keys, $1, clock_timestamp() - $4::bigint * interval '1 millisecond')
        AS w";

/// This replica leaves the queues of waiters of keys `$2`. A batch writes a key's waiters only
/// under the lock of the key's row, so the rows are locked first, in the batches' order.
const LEAVE_SQL: &str = "
WITH locked AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM fence_marks
        WHERE key = ANY($2::text[])
        ORDER BY key COLLATE \"C\"
        FOR UPDATE) AS rows
)
DELETE FROM fence_turn_waiters AS w USING locked
WHERE w.holder = $1 AND w.key = ANY($2::text[])";

/// How long releases wait for takes to share a statement with; another replica waiting for the key
/// waits this much longer.
const RELEASE_DELAY: Duration = Duration::from_millis(2);
/// How soon releases whose statement failed are sent again.
const RELEASE_RETRY: Duration = Duration::from_millis(100);
/// How long a waiter that has not asked again still counts (`fence_turn_waiters`, migration
/// 0006): a few of the gate's retries, so a live waiter is never dropped from the queue.
const WAITER_STALE: Duration = Duration::from_millis(4 * WAITER_RETRY.as_millis() as u64);
/// SQLSTATE `fencegate_turn_batch` raises for a store whose identity is not the adopted one.
const IDENTITY_MISMATCH: &str = "FG001";

pub struct PostgresTurns {
    options: PgConnectOptions,
    holder: Arc<str>,
    expected: Arc<ExpectedIdentity>,
    tasks: PerThread<TurnTask>,
    wants: Arc<TurnWants>,
}

/// One holder task's queue.
#[derive(Clone)]
struct TurnTask {
    commands: mpsc::UnboundedSender<Command>,
}

impl TaskQueue for TurnTask {
    fn is_closed(&self) -> bool {
        self.commands.is_closed()
    }
}

enum Command {
    Take {
        take: TakeTurn,
        reply: oneshot::Sender<Result<Option<Option<u64>>, StoreError>>,
    },
    Release {
        key: String,
        turn: u64,
    },
    Renew {
        renewals: Vec<Renewal>,
        reply: oneshot::Sender<Result<Vec<bool>, StoreError>>,
    },
    /// This replica no longer waits for the key.
    Leave {
        key: String,
    },
}

impl PostgresTurns {
    /// `options` reach fencegate's schema; `holder` names this replica in the turns it takes.
    pub fn new(
        options: PgConnectOptions,
        holder: &str,
        expected: Arc<ExpectedIdentity>,
    ) -> PostgresTurns {
        // The function reads marks committed after its statement began (READ COMMITTED; the
        // space is escaped for the startup packet's option string, which sqlx passes as is).
        let options = options.options([("default_transaction_isolation", "read\\ committed")]);
        let holder: Arc<str> = holder.into();
        PostgresTurns {
            options,
            wants: Arc::new(TurnWants::new(Arc::clone(&holder))),
            holder,
            expected,
            tasks: PerThread::new(),
        }
    }

    fn send(&self, command: Command) -> Result<(), StoreError> {
        let task = self.tasks.queue(|| self.spawn_task())?;
        task.commands.send(command).map_err(|_| StoreError::Closed)
    }

    /// Starts a holder task on the calling runtime.
    fn spawn_task(&self) -> TurnTask {
        let (commands, receiver) = mpsc::unbounded_channel();
        let task = HolderTask {
            options: self.options.clone(),
            holder: Arc::clone(&self.holder),
            expected: Arc::clone(&self.expected),
            wants: Arc::clone(&self.wants),
            connection: None,
            postponed: Vec::new(),
            releases: Vec::new(),
            release_failed: false,
            releases_since: None,
            known_rows: KnownRows::default(),
        };
        tokio::spawn(task.run(Inbox::new(receiver, MAX_BATCH)));
        TurnTask { commands }
    }

    /// Starts, once, the listener that has releases written when another replica wants a key,
    /// with a holder task of its own for them (both on the calling runtime).
    fn start_listener(&self) {
        if self.wants.started() {
            return;
        }
        let task = self.spawn_task();
        let release: ReleaseNow = Arc::new(move |key, turn| {
            let _ = task.commands.send(Command::Release { key, turn });
        });
        self.wants.start(&self.options, release);
    }
}

impl TurnStore for PostgresTurns {
    fn take(&self, take: TakeTurn) -> StoreFuture<'_, Option<Option<u64>>> {
        Box::pin(async move {
            // A take that finds the key held waits to hear of its release.
            self.start_listener();
            let (reply, answer) = oneshot::channel();
            self.send(Command::Take { take, reply })?;
            answer.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn release(&self, key: String, turn: u64, lease: Duration) {
        self.start_listener();
        if self.wants.defer(&key, turn, lease) {
            return;
        }
        // After `close` the lease is left to lapse.
        let _ = self.send(Command::Release { key, turn });
    }

    fn renew(&self, renewals: Vec<Renewal>) -> StoreFuture<'_, Vec<bool>> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            self.send(Command::Renew { renewals, reply })?;
            answer.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn tell_frees(&self, freed: TurnFreed) -> bool {
        self.wants.tell_frees(freed);
        true
    }

    fn leave(&self, key: String) {
        let _ = self.send(Command::Leave { key });
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            drop(self.tasks.close());
            // Ended turns nobody asked for yet would keep their keys closed to the other replicas
            // until they lapse: release them now, on a connection of this call's own.
            let ended = self.wants.close();
            if ended.is_empty() {
                return Ok(());
            }
            let (keys, turns): (Vec<String>, Vec<i64>) = ended
                .into_iter()
                .map(|(key, turn)| (key, turn_arg(turn)))
                .unzip();
            let connected = tokio::time::timeout(STATEMENT_TIMEOUT, self.options.connect()).await;
            let mut connection = match connected {
                Ok(Ok(connection)) => connection,
                Ok(Err(source)) => return Err(backend_error(source)),
                Err(_) => {
                    return Err(backend_error(std::io::Error::other(
                        "connecting to release key turns timed out",
                    )))
                }
            };
            let released = sqlx::query(CLOSE_RELEASE_SQL)
                .bind(&*self.holder)
                .bind(&keys)
                .bind(&turns)
                .bind(millis(WAITER_STALE))
                .execute(&mut connection);
            match tokio::time::timeout(STATEMENT_TIMEOUT, released).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(source)) => Err(backend_error(source)),
                Err(_) => Err(backend_error(std::io::Error::other(
                    "releasing key turns timed out",
                ))),
            }
        })
    }
}

struct HolderTask {
    options: PgConnectOptions,
    holder: Arc<str>,
    expected: Arc<ExpectedIdentity>,
    wants: Arc<TurnWants>,
    connection: Option<PgConnection>,
    /// Takes of a key already in the batch being built, kept for the next one.
    postponed: Vec<Command>,
    /// Releases not yet made: sent with the next takes, or alone after [`RELEASE_DELAY`].
    releases: Vec<(String, u64)>,
    /// The last statement failed: pending releases are sent again after [`RELEASE_RETRY`].
    release_failed: bool,
    /// Since when releases have been waiting (`None` while there are none).
    releases_since: Option<Instant>,
    /// Keys whose rows this task has seen: a plain batch of only these creates none.
    known_rows: KnownRows,
}

/// The takes of one batch, column by column, with their replies.
#[derive(Default)]
struct Takes {
    keys: Vec<String>,
    turns: Vec<i64>,
    leases: Vec<i64>,
    tokens: Vec<Option<i64>>,
    replies: Vec<oneshot::Sender<Result<Option<Option<u64>>, StoreError>>>,
}

impl HolderTask {
    async fn run(mut self, mut inbox: Inbox<mpsc::UnboundedReceiver<Command>>) {
        let mut batch = Vec::new();
        loop {
            let mut flush = false;
            if self.postponed.is_empty() && !self.releases.is_empty() {
                // Releases wait a moment for takes to go with (a statement of releases alone
                // would cost a transaction of its own), then go alone; after a failed statement
                // they are sent again a little later.
                let wait = if self.release_failed {
                    RELEASE_RETRY
                } else {
                    RELEASE_DELAY
                };
                let since = *self.releases_since.get_or_insert_with(Instant::now);
                let left = wait.saturating_sub(since.elapsed());
                match tokio::time::timeout(left, inbox.next_batch(&mut batch)).await {
                    Ok(false) => return,
                    Ok(true) => flush = since.elapsed() >= wait,
                    Err(_) => flush = true,
                }
            } else if self.postponed.is_empty() {
                if !inbox.next_batch(&mut batch).await {
                    return;
                }
            } else {
                batch.append(&mut self.postponed);
                inbox.take_queued(&mut batch);
            }
            self.process(std::mem::take(&mut batch), flush).await;
        }
    }

    /// Answers `batch`; releases wait for the next take unless `flush`.
    async fn process(&mut self, batch: Vec<Command>, flush: bool) {
        let mut takes = Takes::default();
        let mut renewals = Vec::new();
        let mut leaves = Vec::new();
        for command in batch {
            match command {
                // Its caller gave up before it ran: not made.
                Command::Take { reply, .. } if reply.is_closed() => {}
                Command::Take { take, reply } => {
                    // Keys are distinct within a statement: another take of the key (one whose
                    // caller gave up, and the next request's) goes in the next one.
                    if takes.keys.contains(&take.key) {
                        self.postponed.push(Command::Take { take, reply });
                        continue;
                    }
                    takes.keys.push(take.key);
                    takes.turns.push(turn_arg(take.turn));
                    takes.leases.push(millis(take.lease));
                    takes.tokens.push(take.advance.map(encode_mark));
                    takes.replies.push(reply);
                }
                Command::Release { key, turn } => {
                    // The release of a take in this very batch (its caller gave up before it
                    // ran): neither is made.
                    let position = takes
                        .keys
                        .iter()
                        .zip(&takes.turns)
                        .position(|(k, t)| *k == key && *t == turn_arg(turn));
                    match position {
                        Some(i) => takes.remove(i),
                        None => self.releases.push((key, turn)),
                    }
                }
                Command::Renew {
                    renewals: more,
                    reply,
                } => renewals.push((more, reply)),
                Command::Leave { key } => leaves.push(key),
            }
        }
        // A key this batch takes again waits on (the next request of this replica asks for it).
        leaves.retain(|key| !takes.keys.contains(key));
        if !takes.keys.is_empty() || (flush && !self.releases.is_empty()) {
            self.take_and_release(takes).await;
        }
        if !leaves.is_empty() {
            self.leave(&leaves).await;
        }
        for (renewals, reply) in renewals {
            let _ = reply.send(self.renew(&renewals).await);
        }
    }

    /// Runs one batch statement and answers its takes. A statement that failed on a connection
    /// opened before it (one the store may have dropped while it sat idle) is sent once more on a
    /// new connection: a take of the same turn and a release are idempotent, and an advance whose
    /// first attempt may have been made is answered as a failure, not as stale. A statement that
    /// failed leaves its releases queued for the next batch.
    async fn take_and_release(&mut self, takes: Takes) {
        let releases = std::mem::take(&mut self.releases);
        self.releases_since = None;
        let reused = self.connection.is_some();
        let mut ran = self.statement(&releases, &takes).await;
        let retried = reused && matches!(ran, Err(StoreError::Backend { .. }));
        if retried {
            ran = self.statement(&releases, &takes).await;
        }
        let rows = match ran {
            Ok(rows) => {
                self.release_failed = false;
                rows
            }
            Err(error) => {
                tracing::warn!(%error, "a key-turn batch failed");
                self.releases = releases;
                self.release_failed = true;
                // A take that may have been made is released by its caller.
                for reply in takes.replies {
                    let _ = reply.send(Err(error.again()));
                }
                return;
            }
        };
        for (((key, turn), token), (reply, (taken, mark, wanted))) in takes
            .keys
            .into_iter()
            .zip(takes.turns)
            .zip(takes.tokens)
            .zip(takes.replies.into_iter().zip(rows))
        {
            let answer = if retried && taken && token.is_some() && mark == token {
                // The mark is this take's own token: the lost first attempt may have made the
                // advance, so whether the token was new is unknown.
                Err(backend_error(std::io::Error::other(
                    "the answer to a turn take with an advance was lost; its outcome is unknown",
                )))
            } else {
                Ok(taken.then(|| mark.map(decode_mark)))
            };
            let made = answer.is_ok();
            if taken && made && wanted {
                // Another replica waits: the turn's release is written as soon as it is over.
                self.wants.wanted_now(&key);
            }
            if reply.send(answer).is_err() && taken && made {
                // Taken for a caller that went away: give the turn back.
                self.releases.push((key, turn_from_arg(turn)));
            }
        }
    }

    /// One `fencegate_turn_batch` statement; on a failure other than an identity refusal the
    /// connection is given up.
    async fn statement(
        &mut self,
        releases: &[(String, u64)],
        takes: &Takes,
    ) -> Result<Vec<TakeRow>, StoreError> {
        let expected = self.expected.get();
        let holder = Arc::clone(&self.holder);
        let (release_keys, release_turns): (Vec<&str>, Vec<i64>) = releases
            .iter()
            .map(|(key, turn)| (key.as_str(), turn_arg(*turn)))
            .unzip();
        let create = !self.known_rows.all_known(takes.keys.iter());
        let connection = self.connection().await?;
        let tokens: Option<Vec<i64>> = takes.tokens.iter().copied().collect();
        // Every take advances: one plain statement. A release of a key this batch takes again
        // is left out: the take, of this holder's own row, replaces it.
        let plain = tokens.filter(|t| !t.is_empty()).map(|tokens| {
            let (keys, turns): (Vec<&str>, Vec<i64>) = release_keys
                .iter()
                .zip(&release_turns)
                .filter(|(key, _)| !takes.keys.iter().any(|k| k == *key))
                .map(|(key, turn)| (*key, *turn))
                .unzip();
            (keys, turns, tokens)
        });
        let statement = match &plain {
            Some((release_keys, release_turns, tokens)) => Box::pin(take_and_advance(
                connection,
                PlainBatch {
                    holder: &holder,
                    expected: expected.as_deref(),
                    release_keys,
                    release_turns,
                    takes,
                    tokens,
                    create,
                },
            )) as BatchFuture<'_>,
            None => {
                let rows = sqlx::query_as::<_, TakeRow>(
                    "SELECT taken, mark, wanted \
                     FROM fencegate_turn_batch($1, $2, $3, $4, $5, $6, $7, $8, $9) ORDER BY n",
                )
                .bind(&*holder)
                .bind(expected.as_deref())
                .bind(&release_keys)
                .bind(&release_turns)
                .bind(&takes.keys)
                .bind(&takes.turns)
                .bind(&takes.leases)
                .bind(&takes.tokens)
                .bind(millis(WAITER_STALE))
                .fetch_all(connection);
                Box::pin(async move { rows.await.map(Some) }) as BatchFuture<'_>
            }
        };
        let ran = match tokio::time::timeout(STATEMENT_TIMEOUT, statement).await {
            Ok(Ok(None)) => Err(StoreError::Untrusted {
                reason: mismatch_reason(expected.as_deref().unwrap_or_default(), None),
            }),
            Ok(Ok(Some(rows))) if rows.len() == takes.keys.len() => Ok(rows),
            Ok(Ok(Some(rows))) => Err(StoreError::Setup {
                backend: BACKEND,
                detail: format!(
                    "the turn batch answered {} rows for {} takes",
                    rows.len(),
                    takes.keys.len()
                ),
            }),
            Ok(Err(source)) => Err(statement_error(source)),
            Err(_) => Err(backend_error(std::io::Error::other(
                "the turn batch did not answer in time",
            ))),
        };
        match &ran {
            Ok(_) => self.known_rows.learn(takes.keys.iter()),
            Err(StoreError::Untrusted { .. }) => {}
            // The connection's state is unknown: give it up.
            Err(_) => self.connection = None,
        }
        ran
    }

    /// Takes this replica out of the keys' queues of waiters. A failure leaves it there until it
    /// counts as gone ([`WAITER_STALE`]).
    async fn leave(&mut self, keys: &[String]) {
        let holder = Arc::clone(&self.holder);
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(error) => {
                tracing::debug!(%error, "leaving the waiters of key turns failed");
                return;
            }
        };
        let statement = sqlx::query(LEAVE_SQL)
            .bind(&*holder)
            .bind(keys)
            .execute(connection);
        if !matches!(
            tokio::time::timeout(STATEMENT_TIMEOUT, statement).await,
            Ok(Ok(_))
        ) {
            tracing::debug!("leaving the waiters of key turns failed");
            self.connection = None;
        }
    }

    async fn renew(&mut self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        let keys: Vec<&str> = renewals.iter().map(|r| r.key.as_str()).collect();
        let turns: Vec<i64> = renewals.iter().map(|r| turn_arg(r.turn)).collect();
        let leases: Vec<i64> = renewals.iter().map(|r| millis(r.lease)).collect();
        let holder = Arc::clone(&self.holder);
        let connection = self.connection().await?;
        let statement =
            sqlx::query_scalar::<_, String>("SELECT key FROM fencegate_turn_renew($1, $2, $3, $4)")
                .bind(&*holder)
                .bind(&keys)
                .bind(&turns)
                .bind(&leases)
                .fetch_all(connection);
        let renewed = match tokio::time::timeout(STATEMENT_TIMEOUT, statement).await {
            Ok(Ok(renewed)) => renewed,
            Ok(Err(source)) => {
                self.connection = None;
                return Err(statement_error(source));
            }
            Err(_) => {
                self.connection = None;
                return Err(backend_error(std::io::Error::other(
                    "renewing key turns did not answer in time",
                )));
            }
        };
        Ok(renewals.iter().map(|r| renewed.contains(&r.key)).collect())
    }

    /// The task's connection, connecting a new one if there is none.
    async fn connection(&mut self) -> Result<&mut PgConnection, StoreError> {
        if self.connection.is_none() {
            let connected = tokio::time::timeout(STATEMENT_TIMEOUT, self.options.connect()).await;
            self.connection = Some(match connected {
                Ok(Ok(connection)) => connection,
                Ok(Err(source)) => return Err(statement_error(source)),
                Err(_) => {
                    return Err(backend_error(std::io::Error::other(
                        "connecting for key turns timed out",
                    )))
                }
            });
        }
        self.connection.as_mut().ok_or(StoreError::Closed)
    }
}

/// The arguments of one [`TAKE_AND_ADVANCE_SQL`] statement.
struct PlainBatch<'a> {
    holder: &'a str,
    expected: Option<&'a str>,
    release_keys: &'a [&'a str],
    release_turns: &'a [i64],
    takes: &'a Takes,
    tokens: &'a [i64],
    /// Whether a key may lack its row (one this task has not seen).
    create: bool,
}

/// One batch whose every take advances: [`TAKE_AND_ADVANCE_SQL`], sent again with its releases and
/// the takes whose rows it could not lock (rows another batch created meanwhile) until every row
/// is locked. `None` for a store whose identity record is not the adopted one.
async fn take_and_advance(
    connection: &mut PgConnection,
    batch: PlainBatch<'_>,
) -> Result<Option<Vec<TakeRow>>, sqlx::Error> {
    let takes = batch.takes;
    let mut answers: Vec<Option<TakeRow>> = vec![None; takes.keys.len()];
    let mut pending: Vec<usize> = (0..takes.keys.len()).collect();
    let mut create = batch.create;
    for _ in 0..MAX_PLAIN_TRIES {
        let pick = |values: &[i64]| pending.iter().map(|&i| values[i]).collect::<Vec<i64>>();
        let keys: Vec<&str> = pending.iter().map(|&i| takes.keys[i].as_str()).collect();
        let rows = sqlx::query_as::<_, PlainRow>(TAKE_AND_ADVANCE_SQL)
            .bind(batch.holder)
            .bind(batch.expected)
            .bind(batch.release_keys)
            .bind(batch.release_turns)
            .bind(&keys)
            .bind(pick(&takes.turns))
            .bind(pick(&takes.leases))
            .bind(pick(batch.tokens))
            .bind(millis(WAITER_STALE))
            .bind(create)
            .fetch_all(&mut *connection)
            .await?;
        if rows.len() != pending.len() {
            return Err(sqlx::Error::Protocol(format!(
                "the turn batch answered {} rows for {} takes",
                rows.len(),
                pending.len()
            )));
        }
        if rows.iter().any(|(_, _, ok, _, _, _)| !ok) {
            return Ok(None);
        }
        // Nothing but creations is made unless every row was locked; then all of it is.
        let made = rows.first().is_some_and(|(_, _, _, go, _, _)| *go);
        let mut left = Vec::new();
        for (i, (taken, mark, _, _, created, wanted)) in pending.into_iter().zip(rows) {
            if made || created {
                answers[i] = Some((taken, mark, wanted));
            } else {
                left.push(i);
            }
        }
        if made {
            return Ok(Some(answers.into_iter().flatten().collect()));
        }
        if left.is_empty() {
            // Every take created its row, and still a released key's row was not locked.
            break;
        }
        // The takes left and the releases go again.
        create = true;
        tracing::debug!(
            takes = left.len(),
            "turn takes whose rows another batch created go again"
        );
        pending = left;
    }
    Err(sqlx::Error::Protocol(format!(
        "the rows of a turn batch's keys could not be locked in {MAX_PLAIN_TRIES} statements"
    )))
}

impl Takes {
    fn remove(&mut self, i: usize) {
        self.keys.remove(i);
        self.turns.remove(i);
        self.leases.remove(i);
        self.tokens.remove(i);
        // Its caller is gone; the reply is dropped unanswered.
        drop(self.replies.remove(i));
    }
}

/// A turn number as a bigint (turn numbers count up from 1 and never reach the sign bit).
fn turn_arg(turn: u64) -> i64 {
    i64::try_from(turn).unwrap_or(i64::MAX)
}

fn turn_from_arg(turn: i64) -> u64 {
    u64::try_from(turn).unwrap_or(0)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A failed statement: a store that is not the adopted one, or a backend error.
fn statement_error(source: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(e) = &source {
        if e.code().as_deref() == Some(IDENTITY_MISMATCH) {
            return StoreError::Untrusted {
                reason: e.message().to_owned(),
            };
        }
    }
    backend_error(source)
}

fn backend_error(source: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::new(source),
    }
}
