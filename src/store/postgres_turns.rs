//! Key turns on PostgreSQL: rows of `gate_turns` (migration 0005), taken, released and renewed by
//! one holder task per serving thread, each on a connection of its own. Takes and releases queued
//! while a statement runs go together in the next one (`fencegate_turn_batch`), which may also
//! compare-and-advance each key's mark under the turn it takes, so an uncontended serialized write
//! costs a share of one statement. A failed statement frees nothing: the turns it held stay leased.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::ConnectOptions as _;
use tokio::sync::{mpsc, oneshot};

use super::per_thread::{PerThread, TaskQueue};
use super::postgres::{decode_mark, encode_mark};
use super::turns::{Renewal, TakeTurn, TurnStore};
use super::{ExpectedIdentity, StoreError, StoreFuture};

const BACKEND: &str = "postgres";
/// Longest a connect or one batch's statement may take; past it the connection is given up.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most takes and releases in one statement.
const MAX_BATCH: usize = 1024;
/// How soon releases whose statement failed are sent again.
const RELEASE_RETRY: Duration = Duration::from_millis(100);
/// SQLSTATE `fencegate_turn_batch` raises for a store whose identity is not the adopted one.
const IDENTITY_MISMATCH: &str = "FG001";

pub struct PostgresTurns {
    options: PgConnectOptions,
    holder: Arc<str>,
    expected: Arc<ExpectedIdentity>,
    tasks: PerThread<TurnTask>,
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
        PostgresTurns {
            options,
            holder: holder.into(),
            expected,
            tasks: PerThread::new(),
        }
    }

    fn send(&self, command: Command) -> Result<(), StoreError> {
        let task = self.tasks.queue(|| {
            let (commands, receiver) = mpsc::unbounded_channel();
            let task = HolderTask {
                options: self.options.clone(),
                holder: Arc::clone(&self.holder),
                expected: Arc::clone(&self.expected),
                connection: None,
                postponed: Vec::new(),
                releases: Vec::new(),
            };
            tokio::spawn(task.run(receiver));
            TurnTask { commands }
        })?;
        task.commands.send(command).map_err(|_| StoreError::Closed)
    }
}

impl TurnStore for PostgresTurns {
    fn take(&self, take: TakeTurn) -> StoreFuture<'_, Option<Option<u64>>> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            self.send(Command::Take { take, reply })?;
            answer.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn release(&self, key: String, turn: u64) {
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

    fn close(&self) {
        drop(self.tasks.close());
    }
}

struct HolderTask {
    options: PgConnectOptions,
    holder: Arc<str>,
    expected: Arc<ExpectedIdentity>,
    connection: Option<PgConnection>,
    /// Takes of a key already in the batch being built, kept for the next one.
    postponed: Vec<Command>,
    /// Releases not yet made (their statement failed): sent again with the next batch.
    releases: Vec<(String, u64)>,
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
    async fn run(mut self, mut receiver: mpsc::UnboundedReceiver<Command>) {
        let mut batch = Vec::new();
        loop {
            if self.postponed.is_empty() && !self.releases.is_empty() {
                // Releases whose statement failed are sent again soon, with or without company.
                let waited =
                    tokio::time::timeout(RELEASE_RETRY, receiver.recv_many(&mut batch, MAX_BATCH))
                        .await;
                if matches!(waited, Ok(0)) {
                    return;
                }
            } else if self.postponed.is_empty() {
                if receiver.recv_many(&mut batch, MAX_BATCH).await == 0 {
                    return;
                }
            } else {
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
        let mut takes = Takes::default();
        let mut renewals = Vec::new();
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
            }
        }
        if !takes.keys.is_empty() || !self.releases.is_empty() {
            self.take_and_release(takes).await;
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
        let reused = self.connection.is_some();
        let mut ran = self.statement(&releases, &takes).await;
        let retried = reused && matches!(ran, Err(StoreError::Backend { .. }));
        if retried {
            ran = self.statement(&releases, &takes).await;
        }
        let rows = match ran {
            Ok(rows) => rows,
            Err(error) => {
                tracing::warn!(%error, "a key-turn batch failed");
                self.releases = releases;
                // A take that may have been made is released by its caller.
                for reply in takes.replies {
                    let _ = reply.send(Err(error.shared()));
                }
                return;
            }
        };
        for (((key, turn), token), (reply, (taken, mark))) in takes
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
    ) -> Result<Vec<(bool, Option<i64>)>, StoreError> {
        let expected = self.expected.get();
        let holder = Arc::clone(&self.holder);
        let (release_keys, release_turns): (Vec<&str>, Vec<i64>) = releases
            .iter()
            .map(|(key, turn)| (key.as_str(), turn_arg(*turn)))
            .unzip();
        let connection = self.connection().await?;
        let statement = sqlx::query_as::<_, (bool, Option<i64>)>(
            "SELECT taken, mark FROM fencegate_turn_batch($1, $2, $3, $4, $5, $6, $7, $8) ORDER BY n",
        )
        .bind(&*holder)
        .bind(expected.as_deref())
        .bind(&release_keys)
        .bind(&release_turns)
        .bind(&takes.keys)
        .bind(&takes.turns)
        .bind(&takes.leases)
        .bind(&takes.tokens)
        .fetch_all(connection);
        let ran = match tokio::time::timeout(STATEMENT_TIMEOUT, statement).await {
            Ok(Ok(rows)) if rows.len() == takes.keys.len() => Ok(rows),
            Ok(Ok(rows)) => Err(StoreError::Setup {
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
        if let Err(error) = &ran {
            if !matches!(error, StoreError::Untrusted { .. }) {
                // The connection's state is unknown: give it up.
                self.connection = None;
            }
        }
        ran
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
