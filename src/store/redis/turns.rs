//! Key turns on Redis: a key `{prefix}turn:{key}` holding `"{holder} {turn}"` with a `PX` expiry
//! (the server's clock), taken, released and renewed by Lua compare-and-set scripts sent in the
//! serving thread's writer pipeline. A take may compare-and-advance the key's mark in the same
//! script, and checks the store's identity record first.
//!
//! Durability: a turn is as durable as the marks. With `appendonly yes` and `appendfsync always`
//! (what `require_durable` asks for) it survives a restart of the server; a failover to a replica
//! (asynchronous replication) or a restart without persistence can lose it, and with it the order
//! of writes in flight (never I1: the identity check then refuses every write).

use std::sync::Arc;

use redis::{Cmd, Script, Value};

use super::command::Command;
use super::error::wrap;
use super::keys::{mark_key, store_id_key};
use super::pool::WriterPool;
use super::script::{server_answer, unexpected, DECIMAL_ORDER, IDENTITY_CHECK};
use crate::store::guard::expected::{mismatch_reason, ExpectedIdentity};
use crate::store::turns::{Renewal, TakeTurn, TurnStore};
use crate::store::{StoreError, StoreFuture};

/// Run after [`IDENTITY_CHECK`]. KEYS: the store-id record, the turn, the mark. ARGV: the expected
/// store id ('' compares nothing), the holder, the turn, the lease in ms, the token to advance to ('' for none).
/// Answers {1, mark before the advance or false} when taken, {0, false} when another holder has
/// the key, {-2, store id found or false} for another store, {-1, message} for bad input, and
/// {3, false} for a take with a token that repeats one already made (its first attempt's answer
/// was lost): the turn is held, but whether the token was new is unknown.
const TAKE_BODY: &str = r"
local me = ARGV[2] .. ' ' .. ARGV[3]
local current = redis.call('GET', KEYS[2])
if current and current ~= me and string.sub(current, 1, #ARGV[2] + 1) ~= ARGV[2] .. ' ' then
  return {0, false}
end
if current == me and ARGV[5] ~= '' then
  return {3, false}
end
local token = false
if ARGV[5] ~= '' then
  token = canonical(ARGV[5])
  if not token then
    return {-1, 'fencegate: the token is not a decimal number'}
  end
end
local stored = redis.call('GET', KEYS[3])
local mark = false
if stored then
  mark = canonical(stored)
  if not mark then
    return {-1, 'fencegate: the stored mark is not a decimal number'}
  end
end
redis.call('SET', KEYS[2], me, 'PX', ARGV[4])
if token and (not mark or order(token, mark) > 0) then
  redis.call('SET', KEYS[3], token)
end
return {1, mark}
";

/// KEYS: the turn. ARGV: "{holder} {turn}". Deletes the turn only if it is still that one.
const RELEASE_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// KEYS: the turn. ARGV: "{holder} {turn}", the lease in ms. 1 when renewed.
const RENEW_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// The turn scripts, loaded by every writer with the others.
#[derive(Clone)]
pub(super) struct TurnScripts {
    take: Script,
    release: Script,
    renew: Script,
}

impl TurnScripts {
    pub(super) fn new() -> TurnScripts {
        TurnScripts {
            take: Script::new(&format!("{DECIMAL_ORDER}{IDENTITY_CHECK}{TAKE_BODY}")),
            release: Script::new(RELEASE_SCRIPT),
            renew: Script::new(RENEW_SCRIPT),
        }
    }

    pub(super) fn all(&self) -> [&Script; 3] {
        [&self.take, &self.release, &self.renew]
    }
}

pub struct RedisTurns {
    pub(super) writers: Arc<WriterPool>,
    pub(super) prefix: String,
    pub(super) holder: String,
    pub(super) expected: Arc<ExpectedIdentity>,
    pub(super) scripts: TurnScripts,
}

impl RedisTurns {
    fn turn_key(&self, key: &str) -> String {
        format!("{}turn:{key}", self.prefix)
    }

    fn me(&self, turn: u64) -> String {
        format!("{} {turn}", self.holder)
    }

    fn evalsha(script: &Script, keys: &[String], args: &[String]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    }

    async fn send(&self, commands: Vec<Cmd>) -> Result<Vec<Value>, StoreError> {
        self.writers
            .request(|reply| Command::Commands {
                commands,
                reply,
                repeatable: true,
            })
            .await
    }
}

impl TurnStore for RedisTurns {
    fn take(&self, take: TakeTurn) -> StoreFuture<'_, Option<Option<u64>>> {
        Box::pin(async move {
            let expected = self.expected.get();
            let keys = [
                store_id_key(&self.prefix),
                self.turn_key(&take.key),
                mark_key(&self.prefix, &take.key),
            ];
            let args = [
                expected.as_deref().unwrap_or_default().to_owned(),
                self.holder.clone(),
                take.turn.to_string(),
                take.lease.as_millis().max(1).to_string(),
                take.advance.map(|t| t.to_string()).unwrap_or_default(),
            ];
            let command = Self::evalsha(&self.scripts.take, &keys, &args);
            let answer = self.send(vec![command]).await?.pop().unwrap_or(Value::Nil);
            read_take(answer, expected.as_deref())
        })
    }

    fn release(&self, key: String, turn: u64, _lease: std::time::Duration) {
        let command = Self::evalsha(
            &self.scripts.release,
            &[self.turn_key(&key)],
            &[self.me(turn)],
        );
        // A release that cannot be queued leaves the lease to lapse.
        self.writers.forget(vec![command]);
    }

    fn renew(&self, renewals: Vec<Renewal>) -> StoreFuture<'_, Vec<bool>> {
        Box::pin(async move {
            let commands = renewals
                .iter()
                .map(|r| {
                    Self::evalsha(
                        &self.scripts.renew,
                        &[self.turn_key(&r.key)],
                        &[self.me(r.turn), r.lease.as_millis().max(1).to_string()],
                    )
                })
                .collect();
            let answers = self.send(commands).await?;
            answers
                .into_iter()
                .map(|answer| {
                    let renewed: i64 =
                        redis::from_redis_value(server_answer(answer).map_err(wrap)?)
                            .map_err(|e| wrap(e.into()))?;
                    Ok(renewed == 1)
                })
                .collect()
        })
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        // Releases are written as they come; the store's writers close with the store.
        Box::pin(async { Ok(()) })
    }
}

/// Reads the take script's answer.
fn read_take(answer: Value, expected: Option<&str>) -> Result<Option<Option<u64>>, StoreError> {
    let (code, detail): (i64, Option<String>) =
        redis::from_redis_value(server_answer(answer).map_err(wrap)?)
            .map_err(|e| wrap(e.into()))?;
    match code {
        1 => {
            let mark = detail
                .map(|m| {
                    m.parse::<u64>()
                        .map_err(|_| wrap(unexpected(format!("mark {m:?} is not a u64"))))
                })
                .transpose()?;
            Ok(Some(mark))
        }
        0 => Ok(None),
        3 => Err(wrap(unexpected(
            "a repeated turn take with an advance: whether its token was new is unknown".to_owned(),
        ))),
        -2 => Err(StoreError::Untrusted {
            reason: mismatch_reason(expected.unwrap_or_default(), detail.as_deref()),
        }),
        _ => {
            Err(wrap(unexpected(detail.unwrap_or_else(|| {
                format!("the take script answered {code}")
            }))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: i64, detail: Option<&str>) -> Value {
        Value::Array(vec![
            Value::Int(code),
            detail.map_or(Value::Nil, |d| Value::BulkString(d.as_bytes().to_vec())),
        ])
    }

    #[test]
    fn take_answers_are_read_strictly() {
        assert_eq!(read_take(answer(1, None), None).ok(), Some(Some(None)));
        assert_eq!(
            read_take(answer(1, Some("18446744073709551615")), None).ok(),
            Some(Some(Some(u64::MAX)))
        );
        assert_eq!(read_take(answer(0, None), None).ok(), Some(None));
        assert!(matches!(
            read_take(answer(-2, None), Some("abc")),
            Err(StoreError::Untrusted { .. })
        ));
        assert!(read_take(answer(1, Some("-1")), None).is_err());
        assert!(read_take(answer(3, None), None).is_err());
        assert!(read_take(answer(-1, Some("fencegate: bad")), None).is_err());
        assert!(read_take(Value::Nil, None).is_err());
    }
}
