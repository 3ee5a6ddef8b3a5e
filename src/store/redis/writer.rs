//! A writer task: the settings a new one is made from, what it does with each batch its mailbox
//! hands it (`plumbing/mailbox.rs`), and the answers of each batch's pipeline (the pipeline
//! itself: `pipeline.rs`).

use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use redis::{Script, Value};
use tokio::sync::{mpsc, oneshot};

use super::command::{answer_advances, fail, Command};
use super::connection::load_scripts;
use super::error::{backend_error, wrap};
use super::intents::IntentScripts;
use super::script::{is_noscript, read_identity, read_mark, unexpected};
use super::turn_scripts::TurnScripts;
use crate::store::expected::ExpectedIdentity;
use crate::store::plumbing::inbox::Inbox;
use crate::store::plumbing::mailbox::{serve, Owner};
use crate::store::StoreError;

/// Requests that may queue for the writer before callers wait (their store timeout still runs).
const COMMAND_QUEUE: usize = 16 * 1024;

/// The settings every writer shares.
pub(super) struct WriterTemplate {
    pub(super) client: redis::Client,
    pub(super) script: Script,
    pub(super) intent_scripts: IntentScripts,
    pub(super) turn_scripts: TurnScripts,
    pub(super) prefix: String,
    pub(super) max_batch: usize,
    pub(super) url: String,
    pub(super) expected: Arc<ExpectedIdentity>,
}

impl WriterTemplate {
    /// Starts a writer task on the calling runtime; with no `connection` it connects (and loads
    /// the scripts) for its first batch.
    pub(super) fn spawn(&self, connection: Option<MultiplexedConnection>) -> mpsc::Sender<Command> {
        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE);
        let writer = Writer {
            client: self.client.clone(),
            connection,
            lost_connection: false,
            script: self.script.clone(),
            intent_scripts: self.intent_scripts.clone(),
            turn_scripts: self.turn_scripts.clone(),
            prefix: self.prefix.clone(),
            url: self.url.clone(),
            expected: Arc::clone(&self.expected),
        };
        tokio::spawn(serve(writer, Inbox::new(receiver, self.max_batch)));
        commands
    }
}

/// The owner of one Redis connection, serving the requests of one thread.
///
/// Batching needs no timer: while one pipeline is in flight, new requests queue on the channel and
/// the next batch takes all of them, so a lone request never waits for company. When a round trip
/// fails the writer answers that batch with the error, drops the connection and connects again
/// for the next batch.
pub(super) struct Writer {
    pub(super) client: redis::Client,
    /// `None` after a failed round trip (the next batch connects again) and before the first
    /// batch of a writer started without one.
    pub(super) connection: Option<MultiplexedConnection>,
    /// A round trip has failed since this writer started: its next connect is a reconnect.
    pub(super) lost_connection: bool,
    pub(super) script: Script,
    pub(super) intent_scripts: IntentScripts,
    pub(super) turn_scripts: TurnScripts,
    pub(super) prefix: String,
    /// The server's URL without its password, for logs.
    pub(super) url: String,
    /// Compared by every advance script call.
    pub(super) expected: Arc<ExpectedIdentity>,
}

impl Owner for Writer {
    type Command = Command;

    /// Skips the commands whose callers gave up and sends the rest as one pipeline.
    async fn process(&mut self, batch: &mut Vec<Command>) -> Option<oneshot::Sender<()>> {
        let mut close = None;
        let mut pending = Vec::with_capacity(batch.len());
        for command in batch.drain(..) {
            match command {
                Command::Close { reply } => close = Some(reply),
                // A caller that gave up (its store timeout passed) was already refused: skip its
                // work rather than add to the backlog of a slow server.
                Command::Advance { ref reply, .. } if reply.is_closed() => {}
                Command::Current { ref reply, .. } if reply.is_closed() => {}
                Command::Commands { ref reply, .. } if reply.is_closed() => {}
                other => pending.push(other),
            }
        }
        if !pending.is_empty() {
            self.run_batch(pending).await;
        }
        close
    }

    fn refuse(command: Command) -> Option<oneshot::Sender<()>> {
        fail(command, || StoreError::Closed)
    }
}

impl Writer {
    /// Sends `pending` as one pipeline and answers it. Advances, and command groups whose every
    /// command met an empty script cache (a restarted server, `SCRIPT FLUSH`), are sent once more
    /// after loading the scripts again; they were not run, so running them now cannot apply a
    /// token or an intent change twice.
    ///
    /// Every advance of the batch goes into one script call at the head of the pipeline. The
    /// commands of a batch were all in flight at once, none answered yet, so running the
    /// advances first (each key's in arrival order) is an order they could have arrived in.
    async fn run_batch(&mut self, pending: Vec<Command>) {
        let (mut advances, mut others): (Vec<Command>, Vec<Command>) = pending
            .into_iter()
            .partition(|command| matches!(command, Command::Advance { .. }));
        let mut retried = false;
        for first_attempt in [true, false] {
            let reused = self.connection.is_some();
            let mut answer = self.round_trip(&advances, &others).await;
            if let (Err(source), true, true) = (&answer, first_attempt, reused) {
                // The connection may have died while it sat idle (the server restarted, a
                // network blip): the commands that are safe to repeat go again, once, on a new
                // connection; the others are answered with the error.
                tracing::warn!(url = %self.url, error = %source, "redis store round trip failed; repeating what is safe to repeat on a new connection");
                let source = Arc::new(unexpected(source.to_string()));
                let (safe, unsafe_to_repeat): (Vec<Command>, Vec<Command>) =
                    others.into_iter().partition(Command::safe_to_repeat);
                for command in unsafe_to_repeat {
                    fail(command, || backend_error(&source));
                }
                others = safe;
                retried = true;
                answer = self.round_trip(&advances, &others).await;
            }
            let replies = match answer {
                Ok(replies) => replies,
                Err(source) => {
                    tracing::error!(url = %self.url, error = %source, "redis store round trip failed");
                    let source = Arc::new(source);
                    for command in advances.into_iter().chain(others) {
                        fail(command, || backend_error(&source));
                    }
                    return;
                }
            };
            let mut replies = replies.into_iter();
            let mut noscript_advances = Vec::new();
            if !advances.is_empty() {
                let answer = replies.next().unwrap_or(Value::Nil);
                if first_attempt && is_noscript(&answer) {
                    noscript_advances = advances;
                } else {
                    answer_advances(advances, answer, self.expected.get().as_deref(), retried);
                }
            }
            let mut noscript = Vec::new();
            for command in others {
                match command {
                    Command::Current { reply, .. } => {
                        let answer = replies.next().unwrap_or(Value::Nil);
                        let _ = reply.send(read_mark(answer).map_err(wrap));
                    }
                    Command::Identity { reply } => {
                        let set = replies.next().unwrap_or(Value::Nil);
                        let get = replies.next().unwrap_or(Value::Nil);
                        let _ = reply.send(read_identity(set, get).map_err(wrap));
                    }
                    Command::Commands {
                        commands,
                        reply,
                        repeatable,
                    } => {
                        let answers: Vec<Value> = replies.by_ref().take(commands.len()).collect();
                        if first_attempt && !answers.is_empty() && answers.iter().all(is_noscript) {
                            noscript.push(Command::Commands {
                                commands,
                                reply,
                                repeatable,
                            });
                        } else {
                            let _ = reply.send(Ok(answers));
                        }
                    }
                    Command::Forget { commands } => {
                        let answers: Vec<Value> = replies.by_ref().take(commands.len()).collect();
                        if first_attempt && !answers.is_empty() && answers.iter().all(is_noscript) {
                            noscript.push(Command::Forget { commands });
                        }
                    }
                    // `run_batch` keeps advances apart and `process` keeps close requests out.
                    other @ (Command::Advance { .. } | Command::Close { .. }) => {
                        if let Some(close) = fail(other, || StoreError::Closed) {
                            let _ = close.send(());
                        }
                    }
                }
            }
            if noscript_advances.is_empty() && noscript.is_empty() {
                return;
            }
            tracing::warn!(url = %self.url, "the server lost fencegate's scripts; loading them again");
            if let Some(connection) = self.connection.as_mut() {
                if let Err(e) = load_scripts(
                    connection,
                    &self.script,
                    &self.intent_scripts,
                    &self.turn_scripts,
                )
                .await
                {
                    tracing::error!(url = %self.url, error = %e, "loading the scripts failed");
                    self.connection = None;
                    self.lost_connection = true;
                }
            }
            advances = noscript_advances;
            others = noscript;
        }
    }
}
