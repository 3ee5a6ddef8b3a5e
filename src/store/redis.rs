//! The Redis backend: marks as decimal strings under `{key_prefix}mark:{key}`, advanced by one Lua
//! script that compares and sets atomically, a writer task that sends each batch of concurrent
//! requests as one pipeline, and the start-up check of the server's persistence settings.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Script, ServerErrorKind, Value};
use tokio::sync::{mpsc, oneshot};

use super::{decide, new_store_id, Advance, FenceStore, StoreError, StoreFuture, StoreIdentity};
use crate::config::{Compare, RedisStoreConfig, DEFAULT_STORE_TIMEOUT};

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

/// Compare-and-set of one mark. Lua numbers are doubles and cannot hold every u64, so marks and
/// tokens are compared as decimal strings: leading zeros dropped, then shorter is smaller, then
/// digit by digit. Writes only when the mark grows, so an equal `monotonic` token costs no write.
const ADVANCE_SCRIPT: &str = r"
-- KEYS[1]: the mark; ARGV[1]: the token (decimal u64); ARGV[2]: 'monotonic' or 'strict'.
-- Returns {1, previous mark or nil} when the token passes, {0, current mark} when it is stale.
local function canonical(s)
  return string.match(s, '^0*(%d+)$')
end
local function order(a, b)
  if #a ~= #b then
    if #a < #b then return -1 end
    return 1
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      if x < y then return -1 end
      return 1
    end
  end
  return 0
end
local token = canonical(ARGV[1])
if not token then
  return redis.error_reply('ERR fencegate: the token is not a decimal number')
end
local stored = redis.call('GET', KEYS[1])
if not stored then
  redis.call('SET', KEYS[1], token)
  return {1, false}
end
local mark = canonical(stored)
if not mark then
  return redis.error_reply('ERR fencegate: the stored mark is not a decimal number')
end
local cmp = order(token, mark)
local passes
if ARGV[2] == 'strict' then
  passes = cmp > 0
elseif ARGV[2] == 'monotonic' then
  passes = cmp >= 0
else
  return redis.error_reply('ERR fencegate: unknown compare mode')
end
if not passes then
  return {0, mark}
end
if cmp > 0 then
  redis.call('SET', KEYS[1], token)
end
return {1, mark}
";

/// Handle to the writer task; cheap to share behind an `Arc`.
pub struct RedisStore {
    commands: mpsc::Sender<Command>,
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
    Close {
        reply: oneshot::Sender<()>,
    },
}

impl RedisStore {
    /// Connects to the server, loads the advance script, checks the persistence settings and
    /// starts the writer task.
    pub async fn open(config: &RedisStoreConfig) -> Result<RedisStore, StoreError> {
        let url = redact_url(&config.url);
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
        let script = Script::new(ADVANCE_SCRIPT);
        script
            .prepare_invoke()
            .load_async(&mut connection)
            .await
            .map_err(|e| setup(format!("{url}: cannot load the advance script: {e}")))?;
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
        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE);
        let writer = Writer {
            client,
            connection: Some(connection),
            script,
            prefix: config.key_prefix.clone(),
            max_batch: config.max_batch.max(1),
            url,
        };
        tokio::spawn(writer.run(receiver));
        Ok(RedisStore { commands })
    }

    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(make(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
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

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let (reply, done) = oneshot::channel();
            if self.commands.send(Command::Close { reply }).await.is_ok() {
                let _ = done.await;
            }
            Ok(())
        })
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}

/// The single owner of the Redis connection.
///
/// Batching needs no timer: while one pipeline is in flight, new requests queue on the channel and
/// the next loop takes all of them, so a lone request never waits for company. When a round trip
/// fails the writer answers that batch with the error, drops the connection and connects again
/// for the next batch.
struct Writer {
    client: redis::Client,
    /// `None` after a failed round trip: the next batch connects again.
    connection: Option<MultiplexedConnection>,
    script: Script,
    prefix: String,
    max_batch: usize,
    /// The server's URL without its password, for logs.
    url: String,
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
                other => pending.push(other),
            }
        }
        if !pending.is_empty() {
            self.run_batch(pending).await;
        }
        close
    }

    /// Sends `pending` as one pipeline and answers it. Advances that meet an empty script cache
    /// (a restarted server, `SCRIPT FLUSH`) are sent once more after loading the script again;
    /// they were not run, so running them now cannot apply a token twice.
    async fn run_batch(&mut self, mut pending: Vec<Command>) {
        for first_attempt in [true, false] {
            let replies = match self.round_trip(&pending).await {
                Ok(replies) => replies,
                Err(source) => {
                    tracing::error!(url = %self.url, error = %source, "redis store round trip failed");
                    let source = Arc::new(source);
                    for command in pending {
                        fail(command, || backend_error(&source));
                    }
                    return;
                }
            };
            let mut replies = replies.into_iter();
            let mut noscript = Vec::new();
            for command in pending {
                match command {
                    Command::Advance {
                        key,
                        token,
                        compare,
                        reply,
                    } => {
                        let answer = replies.next().unwrap_or(Value::Nil);
                        if first_attempt && is_noscript(&answer) {
                            noscript.push(Command::Advance {
                                key,
                                token,
                                compare,
                                reply,
                            });
                        } else {
                            let _ = reply.send(read_advance(answer, token, compare).map_err(wrap));
                        }
                    }
                    Command::Current { reply, .. } => {
                        let answer = replies.next().unwrap_or(Value::Nil);
                        let _ = reply.send(read_mark(answer).map_err(wrap));
                    }
                    Command::Identity { reply } => {
                        let set = replies.next().unwrap_or(Value::Nil);
                        let get = replies.next().unwrap_or(Value::Nil);
                        let _ = reply.send(read_identity(set, get).map_err(wrap));
                    }
                    // `process` keeps close requests out of a batch.
                    Command::Close { reply } => {
                        let _ = reply.send(());
                    }
                }
            }
            if noscript.is_empty() {
                return;
            }
            tracing::warn!(url = %self.url, "the server lost fencegate's advance script; loading it again");
            if let Some(connection) = self.connection.as_mut() {
                if let Err(e) = self.script.prepare_invoke().load_async(connection).await {
                    tracing::error!(url = %self.url, error = %e, "loading the advance script failed");
                    self.connection = None;
                }
            }
            pending = noscript;
        }
    }

    /// One pipeline for every command of `pending`, in order: an advance is one `EVALSHA`, a
    /// read one `GET`, an identity `SET NX` then `GET`. Per-command server errors come back as
    /// values; an error here means the connection failed and the outcome of the batch is unknown.
    async fn round_trip(&mut self, pending: &[Command]) -> Result<Vec<Value>, RedisError> {
        let mut connection = match &self.connection {
            Some(connection) => connection.clone(),
            None => {
                let mut fresh = connect(&self.client, RECONNECT_TIMEOUT).await?;
                tracing::info!(url = %self.url, "redis store reconnected");
                self.script.prepare_invoke().load_async(&mut fresh).await?;
                self.connection = Some(fresh.clone());
                fresh
            }
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut expected = 0;
        for command in pending {
            match command {
                Command::Advance {
                    key,
                    token,
                    compare,
                    ..
                } => {
                    pipe.invoke_script(
                        self.script
                            .key(mark_key(&self.prefix, key))
                            .arg(token.to_string())
                            .arg(compare_arg(*compare)),
                    );
                    expected += 1;
                }
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
                Command::Close { .. } => {}
            }
        }
        let answer = pipe.query_async::<Vec<Value>>(&mut connection).await;
        match answer {
            Ok(replies) if replies.len() == expected => Ok(replies),
            Ok(replies) => {
                self.connection = None;
                Err(unexpected(format!(
                    "a pipeline of {expected} commands got {} answers",
                    replies.len()
                )))
            }
            Err(e) => {
                self.connection = None;
                Err(e)
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

fn mark_key(prefix: &str, key: &str) -> String {
    format!("{prefix}mark:{key}")
}

fn store_id_key(prefix: &str) -> String {
    format!("{prefix}store-id")
}

fn compare_arg(compare: Compare) -> &'static str {
    match compare {
        Compare::Monotonic => "monotonic",
        Compare::Strict => "strict",
    }
}

fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

/// A per-command answer that is a server error becomes that error.
fn server_answer(reply: Value) -> Result<Value, RedisError> {
    match reply {
        Value::ServerError(e) => Err(e.into()),
        other => Ok(other),
    }
}

/// Reads the script's answer and checks it against [`decide`]: a script that disagrees with the
/// comparison rule is an error, never an answer.
fn read_advance(reply: Value, token: u64, compare: Compare) -> Result<Advance, RedisError> {
    let (passed, mark): (i64, Option<String>) = redis::from_redis_value(server_answer(reply)?)?;
    let mark = mark.as_deref().map(parse_mark).transpose()?;
    let outcome = match (passed, mark) {
        (1, previous) => Advance::Accepted { previous },
        (0, Some(current)) => Advance::Stale { current },
        _ => return Err(unexpected(format!("advance script answered {passed}"))),
    };
    let expected = decide(mark, token, compare);
    if outcome != expected {
        return Err(unexpected(format!(
            "advance script answered {outcome:?} for token {token}, the rule says {expected:?}"
        )));
    }
    Ok(outcome)
}

fn read_mark(reply: Value) -> Result<Option<u64>, RedisError> {
    let mark: Option<String> = redis::from_redis_value(server_answer(reply)?)?;
    mark.as_deref().map(parse_mark).transpose()
}

fn read_identity(set: Value, get: Value) -> Result<StoreIdentity, RedisError> {
    let created = match server_answer(set)? {
        Value::Nil => false,
        Value::Okay => true,
        other => return Err(unexpected(format!("SET NX answered {other:?}"))),
    };
    let id: Option<String> = redis::from_redis_value(server_answer(get)?)?;
    match id {
        Some(id) => Ok(StoreIdentity { id, created }),
        None => Err(unexpected(
            "the store id vanished right after SET NX".to_owned(),
        )),
    }
}

fn parse_mark(text: &str) -> Result<u64, RedisError> {
    text.parse()
        .map_err(|_| unexpected(format!("mark {text:?} is not a u64")))
}

fn unexpected(detail: String) -> RedisError {
    RedisError::from((ErrorKind::UnexpectedReturnType, "unexpected answer", detail))
}

/// What `CONFIG GET` says about persistence.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Persistence {
    appendonly: String,
    appendfsync: String,
    save: String,
}

/// Reads the persistence settings; `Ok(Err(reason))` when the server does not allow `CONFIG`
/// (managed Redis, ACLs). A failed connection is the outer error.
async fn read_persistence(
    connection: &mut MultiplexedConnection,
) -> Result<Result<Persistence, String>, RedisError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for name in ["appendonly", "appendfsync", "save"] {
        pipe.cmd("CONFIG").arg("GET").arg(name);
    }
    let replies: Vec<Value> = pipe.query_async(connection).await?;
    let mut values = Vec::with_capacity(3);
    for (name, reply) in ["appendonly", "appendfsync", "save"]
        .into_iter()
        .zip(replies)
    {
        let pairs: HashMap<String, String> = match server_answer(reply) {
            Ok(reply) => match redis::from_redis_value(reply) {
                Ok(pairs) => pairs,
                Err(e) => return Ok(Err(format!("CONFIG GET {name} answered oddly: {e}"))),
            },
            Err(e) => return Ok(Err(format!("CONFIG GET {name} was refused: {e}"))),
        };
        match pairs.get(name) {
            Some(value) => values.push(value.clone()),
            None => return Ok(Err(format!("CONFIG GET {name} returned no value"))),
        }
    }
    match <[String; 3]>::try_from(values) {
        Ok([appendonly, appendfsync, save]) => Ok(Ok(Persistence {
            appendonly,
            appendfsync,
            save,
        })),
        Err(_) => Ok(Err("CONFIG GET answered too few settings".to_owned())),
    }
}

/// What to do about the server's persistence.
#[derive(Debug, PartialEq, Eq)]
enum Durability {
    /// `appendonly yes` with `appendfsync always`: an accepted advance is on disk.
    Durable,
    /// Serve, but tell the operator what a restart or crash would lose.
    Warn(String),
    /// `require_durable` is set and the server is not durable (or would not say).
    Refuse(String),
}

/// The settings a store with `require_durable` needs.
const NEEDED: &str = "appendonly yes with appendfsync always";

/// Judges what a restart or crash of the server would do to the marks. Only an append-only file
/// synced on every write keeps every accepted advance; anything less can re-admit a stale holder.
fn judge_durability(found: Result<&Persistence, &str>, require_durable: bool) -> Durability {
    let found = match found {
        Ok(found) => found,
        Err(reason) if require_durable => {
            return Durability::Refuse(format!(
            "require_durable is set but the persistence settings cannot be verified ({reason}); \
                 it needs {NEEDED}"
        ))
        }
        Err(reason) => {
            return Durability::Warn(format!(
                "cannot verify that fencing marks survive a restart of Redis ({reason}); \
                 make sure the server runs with {NEEDED}"
            ))
        }
    };
    let aof = found.appendonly.eq_ignore_ascii_case("yes");
    let fsync = found.appendfsync.to_ascii_lowercase();
    if aof && fsync == "always" {
        return Durability::Durable;
    }
    let settings = format!(
        "appendonly {}, appendfsync {}, save \"{}\"",
        found.appendonly, found.appendfsync, found.save
    );
    let risk = if aof && fsync == "everysec" {
        "a crash can lose the last second of accepted advances"
    } else if aof {
        "a crash can lose the accepted advances the OS had not yet written (up to ~30 s)"
    } else if !found.save.trim().is_empty() {
        "a restart or crash loses every advance since the last RDB snapshot"
    } else {
        "the marks do not survive a restart of Redis at all (persistence is off)"
    };
    if require_durable {
        Durability::Refuse(format!(
            "require_durable is set but the server runs with {settings}: {risk}; it needs {NEEDED}"
        ))
    } else {
        Durability::Warn(format!(
            "the server runs with {settings}: {risk}, and a lost mark re-admits stale lock \
             holders; set {NEEDED} in redis.conf (or require_durable = true to refuse such a server)"
        ))
    }
}

/// The URL with its password replaced, for errors and logs.
fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let Some(colon) = authority[..at].find(':') else {
        return url.to_owned();
    };
    let password = rest_start + colon + 1..rest_start + at;
    format!("{}***{}", &url[..password.start], &url[password.end..])
}

fn wrap(source: RedisError) -> StoreError {
    backend_error(&Arc::new(source))
}

fn backend_error(source: &Arc<RedisError>) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Arc::clone(source) as Arc<dyn std::error::Error + Send + Sync>,
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
        Command::Close { reply } => return Some(reply),
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn persistence(appendonly: &str, appendfsync: &str, save: &str) -> Persistence {
        Persistence {
            appendonly: appendonly.to_owned(),
            appendfsync: appendfsync.to_owned(),
            save: save.to_owned(),
        }
    }

    #[test]
    fn append_only_file_synced_always_is_durable() {
        let found = persistence("yes", "always", "");
        assert_eq!(judge_durability(Ok(&found), true), Durability::Durable);
        assert_eq!(judge_durability(Ok(&found), false), Durability::Durable);
    }

    #[test]
    fn no_persistence_at_all_warns_that_marks_do_not_survive_a_restart() {
        let found = persistence("no", "everysec", "");
        let Durability::Warn(message) = judge_durability(Ok(&found), false) else {
            panic!("expected a warning");
        };
        assert!(message.contains("do not survive a restart"), "{message}");
        assert!(message.contains("appendonly no"), "{message}");
        assert!(message.contains(NEEDED), "{message}");
    }

    #[test]
    fn require_durable_refuses_anything_but_fsync_always_naming_the_settings() {
        for (appendonly, appendfsync, save) in [
            ("no", "everysec", ""),
            ("no", "always", "3600 1"),
            ("yes", "everysec", ""),
            ("yes", "no", "3600 1"),
        ] {
            let found = persistence(appendonly, appendfsync, save);
            let Durability::Refuse(detail) = judge_durability(Ok(&found), true) else {
                panic!("{found:?} should be refused");
            };
            assert!(
                detail.contains(&format!(
                    "appendonly {appendonly}, appendfsync {appendfsync}"
                )),
                "{detail}"
            );
            assert!(detail.contains(NEEDED), "{detail}");
        }
    }

    #[test]
    fn each_weaker_setting_names_what_it_loses() {
        let cases = [
            (persistence("yes", "everysec", ""), "last second"),
            (persistence("yes", "no", ""), "not yet written"),
            (
                persistence("no", "everysec", "3600 1 300 100"),
                "RDB snapshot",
            ),
        ];
        for (found, loses) in cases {
            let Durability::Warn(message) = judge_durability(Ok(&found), false) else {
                panic!("{found:?} should warn");
            };
            assert!(message.contains(loses), "{message}");
        }
    }

    #[test]
    fn settings_that_cannot_be_read_warn_or_refuse() {
        let reason = "CONFIG GET appendonly was refused: NOPERM";
        assert!(matches!(
            judge_durability(Err(reason), false),
            Durability::Warn(m) if m.contains("cannot verify") && m.contains("NOPERM")
        ));
        assert!(matches!(
            judge_durability(Err(reason), true),
            Durability::Refuse(d) if d.contains("cannot be verified") && d.contains(NEEDED)
        ));
    }

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact_url("redis://:hunter2@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(
            redact_url("rediss://app:p@ss@cache"),
            "rediss://app:***@cache"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("redis://app@cache"), "redis://app@cache");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn script_answers_are_checked_against_the_rule() {
        let answer = |passed: i64, mark: Option<&str>| {
            Value::Array(vec![
                Value::Int(passed),
                mark.map_or(Value::Nil, |m| Value::BulkString(m.as_bytes().to_vec())),
            ])
        };
        assert_eq!(
            read_advance(answer(1, None), 3, Compare::Strict).ok(),
            Some(Advance::Accepted { previous: None })
        );
        assert_eq!(
            read_advance(
                answer(1, Some("18446744073709551615")),
                u64::MAX,
                Compare::Monotonic
            )
            .ok(),
            Some(Advance::Accepted {
                previous: Some(u64::MAX)
            })
        );
        assert_eq!(
            read_advance(answer(0, Some("10")), 9, Compare::Monotonic).ok(),
            Some(Advance::Stale { current: 10 })
        );
        // A script that accepted a stale token, or a mark beyond u64, is an error.
        assert!(read_advance(answer(1, Some("10")), 9, Compare::Monotonic).is_err());
        assert!(read_advance(answer(0, Some("18446744073709551616")), 1, Compare::Strict).is_err());
        assert!(read_advance(Value::Nil, 1, Compare::Strict).is_err());
    }

    #[test]
    fn identity_answers_report_whether_the_record_was_created() {
        let id = || Value::BulkString(b"abc".to_vec());
        assert_eq!(
            read_identity(Value::Okay, id()).ok(),
            Some(StoreIdentity {
                id: "abc".to_owned(),
                created: true
            })
        );
        assert_eq!(
            read_identity(Value::Nil, id()).ok().map(|i| i.created),
            Some(false)
        );
        assert!(read_identity(Value::Okay, Value::Nil).is_err());
    }
}
