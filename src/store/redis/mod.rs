//! The Redis backend: marks as decimal strings under `{key_prefix}mark:{key}`, and the `RedisStore`
//! handle with one writer task per serving thread, each owning its own connection and sending each
//! batch of its thread's concurrent requests as one pipeline. Scripts: `script.rs` (advance),
//! `intents.rs`; persistence check: `durability.rs`.

mod durability;
mod intents;
mod script;
mod turns;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, RedisError, Script, Value};
use tokio::sync::{mpsc, oneshot};

use crate::config::{Compare, RedisStoreConfig, DEFAULT_STORE_TIMEOUT};
use crate::store::guard::expected::{mismatch_reason, ExpectedIdentity};
use crate::store::plumbing::mailbox;
use crate::store::plumbing::per_thread::PerThread;
use crate::store::plumbing::redact::redact_password;
use crate::store::{new_store_id, Advance, FenceStore, StoreError, StoreFuture, StoreIdentity};
use durability::{judge_durability, read_persistence, Durability};
use intents::IntentScripts;
use script::{
    compare_arg, is_noscript, read_advance, read_identity, read_mark, split_advances, unexpected,
    AdvanceAnswers,
};
pub use turns::RedisTurns;
use turns::TurnScripts;

/// The backend's name in errors, logs and metrics.
const BACKEND: &str = "redis";
/// Requests that may queue for the writer before callers wait (their store timeout still runs).
const COMMAND_QUEUE: usize = 16 * 1024;
/// How long opening waits for the server: an unreachable host fails start-up with a clear error
/// instead of hanging on the operating system's TCP timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the writer waits to reconnect after losing the server: no longer than a caller waits
/// for the store by default, so a dead server answers each batch with an error promptly.
const RECONNECT_TIMEOUT: Duration = DEFAULT_STORE_TIMEOUT;
/// How long one pipeline may wait for its answers before the batch fails and the connection is
/// replaced: covers a slow `appendfsync always` disk, not a hung server.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Handle to the writer tasks; cheap to share behind an `Arc`.
///
/// A writer task runs on the thread (runtime) of the requests it serves, and so does its
/// connection's I/O: a request reaches Redis without waking another thread. Each script is atomic
/// on the server, so writers on different connections need no coordination (I1, I2 hold per
/// script call). The first writer uses the connection `open` checked; the others connect when
/// their thread first asks.
pub struct RedisStore {
    writers: Arc<WriterPool>,
    prefix: String,
    /// For their hashes: the writer loads the scripts on the server.
    scripts: IntentScripts,
    expected: Arc<ExpectedIdentity>,
}

/// The writer of each serving thread, shared by the store and its key turns.
pub(super) struct WriterPool {
    writers: PerThread<mpsc::Sender<Command>>,
    /// What a new writer is made from.
    template: WriterTemplate,
}

impl WriterPool {
    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let writer = self.writers.queue(|| self.template.spawn(None))?;
        mailbox::ask(&writer, make).await
    }

    /// Queues `commands` for the calling thread's next pipeline without waiting for them; their
    /// answers are dropped. `false` if they could not be queued.
    fn forget(&self, commands: Vec<Cmd>) -> bool {
        self.writers
            .queue(|| self.template.spawn(None))
            .is_ok_and(|writer| writer.try_send(Command::Forget { commands }).is_ok())
    }
}

enum Command {
    Advance {
        key: String,
        token: u64,
        compare: Compare,
        reply: oneshot::Sender<Result<Advance, StoreError>>,
    },
    Current {
        key: String,
        reply: oneshot::Sender<Result<Option<u64>, StoreError>>,
    },
    Identity {
        reply: oneshot::Sender<Result<StoreIdentity, StoreError>>,
    },
    /// Commands for the next pipeline, answered in order (the intent store's scripts and reads).
    /// A command that meets a server error is answered with it; the others still run.
    Commands {
        commands: Vec<Cmd>,
        reply: oneshot::Sender<Result<Vec<Value>, StoreError>>,
        /// Whether sending them twice does what sending them once does (see
        /// [`Command::safe_to_repeat`]).
        repeatable: bool,
    },
    /// Commands for the next pipeline whose answers nobody waits for (a turn's release).
    Forget {
        commands: Vec<Cmd>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

impl RedisStore {
    /// Connects to the server, loads the scripts, checks the persistence settings and
    /// starts the writer task.
    pub async fn open(config: &RedisStoreConfig) -> Result<RedisStore, StoreError> {
        let url = redact_password(&config.url);
        let setup = |detail: String| StoreError::Setup {
            backend: BACKEND,
            detail,
        };
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| setup(format!("invalid url {url}: {e}")))?;
        let mut connection = connect(&client, CONNECT_TIMEOUT).await.map_err(|e| {
            setup(format!(
                "cannot connect to {url} (waited up to {}s): {e}",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?;
        let script = Script::new(&script::advance_script());
        let intent_scripts = IntentScripts::new();
        let turn_scripts = TurnScripts::new();
        let expected = Arc::new(ExpectedIdentity::default());
        load_scripts(&mut connection, &script, &intent_scripts, &turn_scripts)
            .await
            .map_err(|e| setup(format!("{url}: cannot load the scripts: {e}")))?;
        let found = read_persistence(&mut connection)
            .await
            .map_err(|e| setup(format!("{url}: cannot read the persistence settings: {e}")))?;
        match judge_durability(
            found.as_ref().map_err(String::as_str),
            config.require_durable,
        ) {
            Durability::Durable => {}
            Durability::Warn(message) => tracing::warn!(url = %url, "redis store: {message}"),
            Durability::Refuse(detail) => return Err(setup(format!("{url}: {detail}"))),
        }
        let template = WriterTemplate {
            client,
            script,
            intent_scripts,
            turn_scripts,
            prefix: config.key_prefix.clone(),
            max_batch: config.max_batch.max(1),
            url,
            expected: Arc::clone(&expected),
        };
        let writers = PerThread::new();
        // The opening thread's writer keeps the connection checked above.
        writers.queue(|| template.spawn(Some(connection)))?;
        Ok(RedisStore {
            writers: Arc::new(WriterPool { writers, template }),
            prefix: config.key_prefix.clone(),
            scripts: IntentScripts::new(),
            expected,
        })
    }

    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        self.writers.request(make).await
    }

    /// The key turns of this store (for the ordering gate), taken under the name `holder`, on
    /// the same writers.
    pub fn turns(&self, holder: &str) -> RedisTurns {
        RedisTurns {
            writers: Arc::clone(&self.writers),
            prefix: self.prefix.clone(),
            holder: holder.to_owned(),
            expected: Arc::clone(&self.expected),
            scripts: TurnScripts::new(),
        }
    }
}

/// The settings every writer shares.
struct WriterTemplate {
    client: redis::Client,
    script: Script,
    intent_scripts: IntentScripts,
    turn_scripts: TurnScripts,
    prefix: String,
    max_batch: usize,
    url: String,
    expected: Arc<ExpectedIdentity>,
}

impl WriterTemplate {
    /// Starts a writer task on the calling runtime; with no `connection` it connects (and loads
    /// the scripts) for its first batch.
    fn spawn(&self, connection: Option<MultiplexedConnection>) -> mpsc::Sender<Command> {
        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE);
        let writer = Writer {
            client: self.client.clone(),
            connection,
            lost_connection: false,
            script: self.script.clone(),
            intent_scripts: self.intent_scripts.clone(),
            turn_scripts: self.turn_scripts.clone(),
            prefix: self.prefix.clone(),
            max_batch: self.max_batch,
            url: self.url.clone(),
            expected: Arc::clone(&self.expected),
        };
        tokio::spawn(writer.run(receiver));
        commands
    }
}

impl FenceStore for RedisStore {
    fn advance(&self, key: &str, token: u64, compare: Compare) -> StoreFuture<'_, Advance> {
        let key = key.to_owned();
        Box::pin(self.request(move |reply| Command::Advance {
            key,
            token,
            compare,
            reply,
        }))
    }

    fn current(&self, key: &str) -> StoreFuture<'_, Option<u64>> {
        let key = key.to_owned();
        Box::pin(self.request(move |reply| Command::Current { key, reply }))
    }

    fn identity(&self) -> StoreFuture<'_, StoreIdentity> {
        Box::pin(self.request(|reply| Command::Identity { reply }))
    }

    fn expect_identity(&self, id: &str) {
        self.expected.set(id);
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            for writer in self.writers.writers.close() {
                mailbox::close(&writer, |reply| Command::Close { reply }).await;
            }
            Ok(())
        })
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}

/// The owner of one Redis connection, serving the requests of one thread.
///
/// Batching needs no timer: while one pipeline is in flight, new requests queue on the channel and
/// the next loop takes all of them, so a lone request never waits for company. When a round trip
/// fails the writer answers that batch with the error, drops the connection and connects again
/// for the next batch.
struct Writer {
    client: redis::Client,
    /// `None` after a failed round trip (the next batch connects again) and before the first
    /// batch of a writer started without one.
    connection: Option<MultiplexedConnection>,
    /// A round trip has failed since this writer started: its next connect is a reconnect.
    lost_connection: bool,
    script: Script,
    intent_scripts: IntentScripts,
    turn_scripts: TurnScripts,
    prefix: String,
    max_batch: usize,
    /// The server's URL without its password, for logs.
    url: String,
    /// Compared by every advance script call.
    expected: Arc<ExpectedIdentity>,
}

impl Writer {
    async fn run(mut self, mut receiver: mpsc::Receiver<Command>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while let Some(first) = receiver.recv().await {
            batch.push(first);
            while batch.len() < self.max_batch {
                match receiver.try_recv() {
                    Ok(command) => batch.push(command),
                    Err(_) => break,
                }
            }
            if let Some(close) = self.process(&mut batch).await {
                receiver.close();
                // Answer whatever raced in behind the close so no caller waits forever.
                while let Ok(command) = receiver.try_recv() {
                    if let Some(other_close) = fail(command, || StoreError::Closed) {
                        let _ = other_close.send(());
                    }
                }
                self.connection = None;
                let _ = close.send(());
                return;
            }
        }
    }

    /// Answers every command of `batch` (draining it); returns the reply of a close request.
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

    /// One pipeline: every advance in one `EVALSHA` of the advance script (when there is any),
    /// then each other command in order: a read is one `GET`, an identity `SET NX` then `GET`, a
    /// group its commands. Per-command server errors come back as values; an error here means the
    /// connection failed and the outcome of the batch is unknown.
    async fn round_trip(
        &mut self,
        advances: &[Command],
        others: &[Command],
    ) -> Result<Vec<Value>, RedisError> {
        let mut connection = match &self.connection {
            Some(connection) => connection.clone(),
            None => {
                let mut fresh = connect(&self.client, RECONNECT_TIMEOUT).await?;
                if self.lost_connection {
                    tracing::info!(url = %self.url, "redis store reconnected");
                } else {
                    tracing::debug!(url = %self.url, "redis store writer connected");
                }
                load_scripts(
                    &mut fresh,
                    &self.script,
                    &self.intent_scripts,
                    &self.turn_scripts,
                )
                .await?;
                self.connection = Some(fresh.clone());
                fresh
            }
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut expected = 0;
        if !advances.is_empty() {
            let mut invocation = self.script.prepare_invoke();
            let adopted = self.expected.get();
            invocation
                .key(store_id_key(&self.prefix))
                .arg(adopted.as_deref().unwrap_or_default());
            for command in advances {
                if let Command::Advance {
                    key,
                    token,
                    compare,
                    ..
                } = command
                {
                    invocation
                        .key(mark_key(&self.prefix, key))
                        .arg(token.to_string())
                        .arg(compare_arg(*compare));
                }
            }
            pipe.invoke_script(&invocation);
            expected += 1;
        }
        for command in others {
            match command {
                Command::Current { key, .. } => {
                    pipe.get(mark_key(&self.prefix, key));
                    expected += 1;
                }
                Command::Identity { .. } => {
                    let key = store_id_key(&self.prefix);
                    pipe.cmd("SET").arg(&key).arg(new_store_id()).arg("NX");
                    pipe.get(key);
                    expected += 2;
                }
                Command::Commands { commands, .. } | Command::Forget { commands } => {
                    for command in commands {
                        pipe.add_command(command.clone());
                    }
                    expected += commands.len();
                }
                Command::Advance { .. } | Command::Close { .. } => {}
            }
        }
        let answer = pipe.query_async::<Vec<Value>>(&mut connection).await;
        match answer {
            Ok(replies) if replies.len() == expected => Ok(replies),
            Ok(replies) => {
                self.connection = None;
                self.lost_connection = true;
                Err(unexpected(format!(
                    "a pipeline of {expected} commands got {} answers",
                    replies.len()
                )))
            }
            Err(e) => {
                self.connection = None;
                self.lost_connection = true;
                Err(e)
            }
        }
    }
}

/// Answers each of `advances` from its part of the advance script's `answer`.
/// After a repeat (`retried`), a stale answer whose mark is the advance's own token may be the
/// lost first attempt's doing: it is answered as a failure, never as stale.
fn answer_advances(advances: Vec<Command>, answer: Value, expected: Option<&str>, retried: bool) {
    match split_advances(answer, advances.len()) {
        Ok(AdvanceAnswers::Wiped { found }) => {
            let reason = mismatch_reason(expected.unwrap_or_default(), found.as_deref());
            for command in advances {
                fail(command, || StoreError::Untrusted {
                    reason: reason.clone(),
                });
            }
        }
        Ok(AdvanceAnswers::Each(answers)) => {
            for (command, answer) in advances.into_iter().zip(answers) {
                if let Command::Advance {
                    token,
                    compare,
                    reply,
                    ..
                } = command
                {
                    let outcome = match read_advance(answer, token, compare) {
                        Ok(Advance::Stale { current }) if retried && current == token => {
                            Err(wrap(unexpected(
                                "the answer to a repeated advance may be its own first attempt's"
                                    .to_owned(),
                            )))
                        }
                        other => other.map_err(wrap),
                    };
                    let _ = reply.send(outcome);
                }
            }
        }
        Err(source) => {
            let source = Arc::new(source);
            for command in advances {
                fail(command, || backend_error(&source));
            }
        }
    }
}

/// Connects (TCP, handshake, `AUTH`/`SELECT` from the URL) within `timeout`; every later request
/// on the connection is bounded by [`RESPONSE_TIMEOUT`].
async fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> Result<MultiplexedConnection, RedisError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    match tokio::time::timeout(
        timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(connection) => connection,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connecting timed out",
        ))),
    }
}

/// Loads the advance script and the intent scripts into the server's script cache.
async fn load_scripts(
    connection: &mut MultiplexedConnection,
    advance: &Script,
    intents: &IntentScripts,
    turns: &TurnScripts,
) -> Result<(), RedisError> {
    for script in std::iter::once(advance)
        .chain(intents.all())
        .chain(turns.all())
    {
        script.load_async(connection).await?;
    }
    Ok(())
}

pub(super) fn mark_key(prefix: &str, key: &str) -> String {
    format!("{prefix}mark:{key}")
}

pub(super) fn store_id_key(prefix: &str) -> String {
    format!("{prefix}store-id")
}

pub(super) fn wrap(source: RedisError) -> StoreError {
    backend_error(&Arc::new(source))
}

fn backend_error(source: &Arc<RedisError>) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::clone(source) as Arc<dyn std::error::Error + Send + Sync>,
    }
}

impl Command {
    /// Whether sending the command twice does what sending it once does: reads, the identity's
    /// `SET NX`, a turn's release (a compare-and-delete), advances (compare-and-set; a repeated
    /// one's answer is checked, see `answer_advances`), and command groups marked so (turn takes
    /// and renewals; the take script tells a repeat of its own take apart). Intent scripts, whose
    /// answers depend on whether the first attempt ran, are not.
    fn safe_to_repeat(&self) -> bool {
        match self {
            Command::Advance { .. }
            | Command::Current { .. }
            | Command::Identity { .. }
            | Command::Forget { .. } => true,
            Command::Commands { repeatable, .. } => *repeatable,
            Command::Close { .. } => false,
        }
    }
}

/// Answers `command` with `error()`; a close request is handed back to the caller instead.
fn fail(command: Command, error: impl Fn() -> StoreError) -> Option<oneshot::Sender<()>> {
    match command {
        Command::Advance { reply, .. } => {
            let _ = reply.send(Err(error()));
        }
        Command::Current { reply, .. } => {
            let _ = reply.send(Err(error()));
        }
        Command::Identity { reply } => {
            let _ = reply.send(Err(error()));
        }
        Command::Commands { reply, .. } => {
            let _ = reply.send(Err(error()));
        }
        Command::Forget { .. } => {}
        Command::Close { reply } => return Some(reply),
    }
    None
}
