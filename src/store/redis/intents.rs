//! Intent records in Redis: a hash per intent plus two sorted-set indexes, changed only by atomic
//! per-key Lua scripts (`begin`'s verdict re-checked against `decide_begin`), sent through the
//! writer task as `Command::Commands` so they share its pipelining, reconnects and script reloads.

use std::collections::HashMap;

use redis::{Cmd, RedisError, Script, Value};

use super::command::Command;
use super::error::wrap;
use super::keys::{mark_key, store_id_key};
use super::script::{
    compare_arg, read_advance, server_answer, unexpected, ADVANCE_FUNCTION, DECIMAL_ORDER,
    IDENTITY_CHECK,
};
use super::RedisStore;
use crate::config::Compare;
use crate::store::expected::mismatch_reason;
use crate::store::intents::{
    decide_begin, BeginRequest, Begun, IntentCensus, IntentRecord, IntentState, IntentStore,
    Resolution, StoredOutcome,
};
use crate::store::{Advance, AdvanceAndBegin, AdvancedAndBegun, StoreError, StoreFuture};

/// `decide_begin` in Lua, run after [`DECIMAL_ORDER`]. Times are milliseconds, exact in doubles.
const BEGIN_BODY: &str = r"
-- KEYS: the intent's hash, the submitting index, the expiry index.
-- ARGV: key, route, fence, fingerprint, attempt, attempt_expires_ms, now_ms, expires_ms.
-- Returns {verdict, detail, the record as it was (HGETALL pairs)}.
local fence = canonical(ARGV[3])
if not fence then
  return redis.error_reply('ERR fencegate: the fence is not a decimal number')
end
local now = tonumber(ARGV[7])
local before = redis.call('HGETALL', KEYS[1])
local record = {}
for i = 1, #before, 2 do record[before[i]] = before[i + 1] end
if #before > 0 then
  if not (record.fingerprint and record.state and canonical(record.fence or '')
      and tonumber(record.expires_ms or '') and tonumber(record.attempt_expires_ms or '')) then
    return redis.error_reply('ERR fencegate: the intent record is malformed')
  end
end
if #before == 0 or tonumber(record.expires_ms) <= now then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'key', ARGV[1], 'route', ARGV[2], 'fence', fence,
    'fingerprint', ARGV[4], 'state', 'SUBMITTING', 'attempt', ARGV[5],
    'attempt_expires_ms', ARGV[6], 'created_ms', ARGV[7], 'updated_ms', ARGV[7],
    'expires_ms', ARGV[8])
  redis.call('ZADD', KEYS[2], ARGV[7], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[8], ARGV[1])
  return {'fresh', false, before}
end
if record.fingerprint ~= ARGV[4] then return {'mismatch', false, before} end
if record.state == 'COMPLETED' then return {'completed', record.outcome or false, before} end
local lease = tonumber(record.attempt_expires_ms)
if record.attempt and lease > now then return {'in_flight', lease - now, before} end
local recorded = canonical(record.fence)
if order(fence, recorded) < 0 then return {'superseded', recorded, before} end
redis.call('HSET', KEYS[1], 'fence', fence, 'attempt', ARGV[5],
  'attempt_expires_ms', ARGV[6], 'updated_ms', ARGV[7])
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[1])
return {'resubmit', recorded, before}
";

/// An idempotent write's advance and its intent's begin in one call, run after
/// [`DECIMAL_ORDER`], [`IDENTITY_CHECK`], [`ADVANCE_FUNCTION`] and [`BEGIN_BODY`] wrapped as the
/// function `begin(KEYS, ARGV)`. The begin runs only when the advance passed.
const ADVANCE_AND_BEGIN_CALL: &str = r"
-- KEYS: the store's identity record, the write's mark, the intent's hash, the submitting index,
-- the expiry index. ARGV: the adopted store's id ('' for none), the token, the compare mode,
-- then begin's eight arguments. Returns {the advance's answer, begin's answer or false}, or the
-- identity check's refusal.
local advanced = advance(KEYS[2], ARGV[2], ARGV[3])
if advanced[1] ~= 1 then return {advanced, false} end
return {advanced, begin({KEYS[3], KEYS[4], KEYS[5]},
  {ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]})}
";

/// `complete` and `resolve`: settles a SUBMITTING intent with an outcome, or forgets it.
const SETTLE_SCRIPT: &str = r"
-- KEYS: the intent's hash, the submitting index, the expiry index.
-- ARGV: key, 'outcome' or 'release', outcome JSON (for 'outcome'), now_ms. Returns 1 or 0.
if redis.call('HGET', KEYS[1], 'state') ~= 'SUBMITTING' then return 0 end
if ARGV[2] == 'release' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 1
elseif ARGV[2] ~= 'outcome' then
  return redis.error_reply('ERR fencegate: unknown settlement')
end
redis.call('HSET', KEYS[1], 'state', 'COMPLETED', 'outcome', ARGV[3], 'updated_ms', ARGV[4])
redis.call('HDEL', KEYS[1], 'attempt')
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
";

/// `abandon`: ends the named attempt of a SUBMITTING intent; any other attempt is left alone.
const ABANDON_SCRIPT: &str = r"
-- KEYS: the intent's hash, the submitting index. ARGV: key, attempt, now_ms. Returns 1 or 0.
local found = redis.call('HMGET', KEYS[1], 'state', 'attempt')
if found[1] ~= 'SUBMITTING' or found[2] ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], 'attempt')
redis.call('HSET', KEYS[1], 'updated_ms', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
";

/// `prune`, per key listed by the expiry index: deletes the record if its retention ended.
const PRUNE_SCRIPT: &str = r"
-- KEYS: the intent's hash, the submitting index, the expiry index. ARGV: key, now_ms.
-- Returns 1 when a record was deleted.
local expires = redis.call('HGET', KEYS[1], 'expires_ms')
if expires then
  local at = tonumber(expires)
  if not at then return redis.error_reply('ERR fencegate: the intent record is malformed') end
  if at > tonumber(ARGV[2]) then
    redis.call('ZADD', KEYS[3], expires, ARGV[1])
    return 0
  end
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return redis.call('DEL', KEYS[1])
";

/// The intent scripts, loaded by the writer with the advance script on every (re)connect.
#[derive(Clone)]
pub(super) struct IntentScripts {
    begin: Script,
    advance_and_begin: Script,
    settle: Script,
    abandon: Script,
    prune: Script,
}

impl IntentScripts {
    pub(super) fn new() -> IntentScripts {
        IntentScripts {
            begin: Script::new(&format!("{DECIMAL_ORDER}{BEGIN_BODY}")),
            advance_and_begin: Script::new(&format!(
                "{DECIMAL_ORDER}{IDENTITY_CHECK}{ADVANCE_FUNCTION}\nlocal function begin(KEYS, ARGV)\n{BEGIN_BODY}\nend\n{ADVANCE_AND_BEGIN_CALL}"
            )),
            settle: Script::new(SETTLE_SCRIPT),
            abandon: Script::new(ABANDON_SCRIPT),
            prune: Script::new(PRUNE_SCRIPT),
        }
    }

    pub(super) fn all(&self) -> [&Script; 5] {
        [
            &self.begin,
            &self.advance_and_begin,
            &self.settle,
            &self.abandon,
            &self.prune,
        ]
    }
}

impl RedisStore {
    fn intent_key(&self, key: &str) -> String {
        format!("{}intent:{key}", self.prefix)
    }

    fn submitting_key(&self) -> String {
        format!("{}intents:submitting", self.prefix)
    }

    fn expiry_key(&self) -> String {
        format!("{}intents:expiry", self.prefix)
    }

    /// `EVALSHA` of `script` on the intent `key`, its hash and both indexes as keys.
    fn invoke(&self, script: &Script, key: &str, args: &[&str]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(3).arg(self.intent_key(key));
        cmd.arg(self.submitting_key()).arg(self.expiry_key());
        cmd.arg(key).arg(args);
        cmd
    }

    /// Sends `commands` in the writer's next pipeline; their answers in order, server errors
    /// turned into errors.
    async fn send(&self, commands: Vec<Cmd>) -> Result<Vec<Value>, StoreError> {
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        let answers = self
            .request(|reply| Command::Commands {
                commands,
                reply,
                repeatable: false,
            })
            .await?;
        answers
            .into_iter()
            .map(|answer| server_answer(answer).map_err(wrap))
            .collect()
    }

    async fn send_one(&self, command: Cmd) -> Result<Value, StoreError> {
        let mut answers = self.send(vec![command]).await?;
        answers
            .pop()
            .ok_or_else(|| wrap(unexpected("a command got no answer".to_owned())))
    }

    /// The members of `index` scored up to `max` (a ZRANGEBYSCORE bound), lowest first.
    async fn range(
        &self,
        index: String,
        max: String,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut cmd = redis::cmd("ZRANGEBYSCORE");
        cmd.arg(index)
            .arg("-inf")
            .arg(max)
            .arg("LIMIT")
            .arg(0)
            .arg(limit);
        redis::from_redis_value(self.send_one(cmd).await?).map_err(|e| wrap(e.into()))
    }
}

impl IntentStore for RedisStore {
    fn begin(&self, request: BeginRequest) -> StoreFuture<'_, Begun> {
        Box::pin(async move {
            let args = [
                request.route.as_str(),
                &request.fence.to_string(),
                &request.fingerprint,
                &request.attempt,
                &request.attempt_expires_ms.to_string(),
                &request.now_ms.to_string(),
                &request.expires_ms.to_string(),
            ];
            let cmd = self.invoke(&self.scripts.begin, &request.key, &args);
            read_begin(self.send_one(cmd).await?, &request).map_err(wrap)
        })
    }

    fn complete(&self, key: &str, outcome: StoredOutcome, now_ms: u64) -> StoreFuture<'_, bool> {
        let args = ["outcome", &outcome.to_json(), &now_ms.to_string()];
        let cmd = self.invoke(&self.scripts.settle, key, &args);
        Box::pin(async move { read_flag(self.send_one(cmd).await?) })
    }

    fn abandon(&self, key: &str, attempt: &str, now_ms: u64) -> StoreFuture<'_, ()> {
        let cmd = self.invoke(&self.scripts.abandon, key, &[attempt, &now_ms.to_string()]);
        Box::pin(async move { read_flag(self.send_one(cmd).await?).map(|_| ()) })
    }

    fn get(&self, key: &str) -> StoreFuture<'_, Option<IntentRecord>> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.intent_key(key));
        Box::pin(async move { read_record(self.send_one(cmd).await?).map_err(wrap) })
    }

    fn list_submitting(
        &self,
        updated_before_ms: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<IntentRecord>> {
        Box::pin(async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let before = format!("({updated_before_ms}");
            let keys = self.range(self.submitting_key(), before, limit).await?;
            let reads = keys.iter().map(|key| {
                let mut cmd = redis::cmd("HGETALL");
                cmd.arg(self.intent_key(key));
                cmd
            });
            let mut records = Vec::with_capacity(keys.len());
            for answer in self.send(reads.collect()).await? {
                // A hash that vanished, or was settled, since the range was read is skipped.
                if let Some(record) = read_record(answer).map_err(wrap)? {
                    if record.state == IntentState::Submitting {
                        records.push(record);
                    }
                }
            }
            Ok(records)
        })
    }

    fn census(&self) -> StoreFuture<'_, IntentCensus> {
        Box::pin(async move {
            let mut count = redis::cmd("ZCARD");
            count.arg(self.submitting_key());
            let mut oldest = redis::cmd("ZRANGE");
            oldest
                .arg(self.submitting_key())
                .arg(0)
                .arg(0)
                .arg("WITHSCORES");
            // Every record is in the expiry index until it is pruned.
            let mut all = redis::cmd("ZCARD");
            all.arg(self.expiry_key());
            let mut answers = self.send(vec![count, oldest, all]).await?.into_iter();
            let (Some(count), Some(oldest), Some(all)) =
                (answers.next(), answers.next(), answers.next())
            else {
                return Err(wrap(unexpected(
                    "the census got too few answers".to_owned(),
                )));
            };
            let read = |value| redis::from_redis_value::<u64>(value).map_err(|e| wrap(e.into()));
            let (submitting, all) = (read(count)?, read(all)?);
            // The index's score is the intent's last update, in milliseconds.
            let oldest: Vec<(String, f64)> =
                redis::from_redis_value(oldest).map_err(|e| wrap(e.into()))?;
            Ok(IntentCensus {
                submitting,
                oldest_submitting_ms: oldest.first().map(|(_, score)| *score as u64),
                completed: all.saturating_sub(submitting),
            })
        })
    }

    fn resolve(&self, key: &str, resolution: Resolution, now_ms: u64) -> StoreFuture<'_, bool> {
        let args = match resolution {
            Resolution::Outcome(outcome) => ["outcome".to_owned(), outcome.to_json()],
            Resolution::Release => ["release".to_owned(), String::new()],
        };
        let [mode, outcome] = args;
        let cmd = self.invoke(
            &self.scripts.settle,
            key,
            &[&mode, &outcome, &now_ms.to_string()],
        );
        Box::pin(async move { read_flag(self.send_one(cmd).await?) })
    }

    fn prune(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            if limit == 0 {
                return Ok(0);
            }
            let now = now_ms.to_string();
            let keys = self.range(self.expiry_key(), now.clone(), limit).await?;
            let prunes = keys
                .iter()
                .map(|key| self.invoke(&self.scripts.prune, key, &[&now]))
                .collect();
            let mut pruned = 0;
            for answer in self.send(prunes).await? {
                pruned += usize::from(read_flag(answer)?);
            }
            Ok(pruned)
        })
    }
}

fn read_flag(answer: Value) -> Result<bool, StoreError> {
    match answer {
        Value::Int(0) => Ok(false),
        Value::Int(1) => Ok(true),
        other => Err(wrap(unexpected(format!(
            "an intent script answered {other:?}"
        )))),
    }
}

/// Reads a hash (HGETALL pairs); empty is no record.
fn read_record(answer: Value) -> Result<Option<IntentRecord>, RedisError> {
    let fields: HashMap<String, String> = redis::from_redis_value(server_answer(answer)?)?;
    if fields.is_empty() {
        return Ok(None);
    }
    let text = |name: &str| {
        fields
            .get(name)
            .cloned()
            .ok_or_else(|| unexpected(format!("an intent record lacks {name}")))
    };
    let number = |name: &str| {
        let value = text(name)?;
        value
            .parse::<u64>()
            .map_err(|_| unexpected(format!("intent field {name} is {value:?}, not a u64")))
    };
    let state = text("state")?;
    let outcome = match fields.get("outcome") {
        Some(json) => Some(
            StoredOutcome::from_json(json)
                .ok_or_else(|| unexpected("an intent's stored outcome is not valid".to_owned()))?,
        ),
        None => None,
    };
    Ok(Some(IntentRecord {
        key: text("key")?,
        route: text("route")?,
        fence: number("fence")?,
        fingerprint: text("fingerprint")?,
        state: IntentState::parse(&state)
            .ok_or_else(|| unexpected(format!("intent state {state:?} is unknown")))?,
        attempt: fields.get("attempt").cloned(),
        attempt_expires_ms: number("attempt_expires_ms")?,
        created_ms: number("created_ms")?,
        updated_ms: number("updated_ms")?,
        expires_ms: number("expires_ms")?,
        outcome,
    }))
}

impl AdvanceAndBegin for RedisStore {
    /// One script call in the serving thread's pipeline: the advance, and only when it passes,
    /// the begin, atomically.
    fn advance_and_begin(
        &self,
        key: &str,
        token: u64,
        compare: Compare,
        begin: BeginRequest,
    ) -> StoreFuture<'_, AdvancedAndBegun> {
        let expected = self.expected.get();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.scripts.advance_and_begin.get_hash()).arg(5);
        cmd.arg(store_id_key(&self.prefix))
            .arg(mark_key(&self.prefix, key))
            .arg(self.intent_key(&begin.key))
            .arg(self.submitting_key())
            .arg(self.expiry_key());
        cmd.arg(expected.as_deref().unwrap_or(""))
            .arg(token.to_string())
            .arg(compare_arg(compare));
        cmd.arg(&begin.key)
            .arg(&begin.route)
            .arg(begin.fence.to_string())
            .arg(&begin.fingerprint)
            .arg(&begin.attempt)
            .arg(begin.attempt_expires_ms.to_string())
            .arg(begin.now_ms.to_string())
            .arg(begin.expires_ms.to_string());
        Box::pin(async move {
            let answer = self.send_one(cmd).await?;
            read_advance_and_begin(answer, token, compare, &begin, expected.as_deref())
        })
    }
}

/// Reads the advance-and-begin call's answer: the identity check's refusal, or the advance's
/// answer and, when it passed, the begin's, each checked as its own call's would be.
fn read_advance_and_begin(
    answer: Value,
    token: u64,
    compare: Compare,
    request: &BeginRequest,
    expected: Option<&str>,
) -> Result<AdvancedAndBegun, StoreError> {
    let parts: Vec<Value> = redis::from_redis_value(answer).map_err(|e| wrap(e.into()))?;
    let mut parts = parts.into_iter();
    let (first, second) = (parts.next(), parts.next());
    if let Some(Value::Int(-2)) = first {
        let found: Option<String> = match second {
            Some(value) => redis::from_redis_value(value).map_err(|e| wrap(e.into()))?,
            None => None,
        };
        return Err(StoreError::Untrusted {
            reason: mismatch_reason(expected.unwrap_or_default(), found.as_deref()),
        });
    }
    let (Some(advanced), Some(begun)) = (first, second) else {
        return Err(wrap(unexpected(
            "the advance-and-begin script answered fewer than two parts".to_owned(),
        )));
    };
    let advance = read_advance(advanced, token, compare).map_err(wrap)?;
    let begun = match advance {
        Advance::Accepted { .. } => {
            Some(read_begin(server_answer(begun).map_err(wrap)?, request).map_err(wrap))
        }
        Advance::Stale { .. } => None,
    };
    Ok(AdvancedAndBegun { advance, begun })
}

/// Reads the begin script's verdict and checks it against [`decide_begin`] on the record the
/// script found: a script that disagrees with the rule is an error, never an answer.
fn read_begin(answer: Value, request: &BeginRequest) -> Result<Begun, RedisError> {
    let (verdict, detail, before): (String, Option<String>, Value) =
        redis::from_redis_value(answer)?;
    let found = read_record(before)?;
    let (expected, _) = decide_begin(found.as_ref(), request);
    let number = |text: &str| {
        text.parse::<u64>()
            .map_err(|_| unexpected(format!("the begin script answered {verdict} {text:?}")))
    };
    let answered = match (verdict.as_str(), detail.as_deref()) {
        ("fresh", None) => Begun::Fresh,
        ("mismatch", None) => Begun::Mismatch,
        ("completed", Some(json)) => Begun::Completed(
            StoredOutcome::from_json(json)
                .ok_or_else(|| unexpected("an intent's stored outcome is not valid".to_owned()))?,
        ),
        // A completed record without an outcome: the rule's stand-in answer is replayed.
        ("completed", None) if matches!(expected, Begun::Completed(_)) => expected.clone(),
        ("in_flight", Some(wait)) => Begun::InFlight {
            retry_after_ms: number(wait)?,
        },
        ("superseded", Some(recorded)) => Begun::Superseded {
            fence: number(recorded)?,
        },
        ("resubmit", Some(recorded)) => Begun::Resubmit {
            previous_fence: number(recorded)?,
        },
        _ => {
            return Err(unexpected(format!(
                "the begin script answered {verdict:?} ({detail:?})"
            )))
        }
    };
    if answered != expected {
        return Err(unexpected(format!(
            "the begin script answered {answered:?} for {request:?}, the rule says {expected:?}"
        )));
    }
    Ok(answered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(fence: u64, now_ms: u64) -> BeginRequest {
        BeginRequest {
            key: "k".to_owned(),
            route: "payouts".to_owned(),
            fence,
            fingerprint: "fp".to_owned(),
            attempt: "mine".to_owned(),
            attempt_expires_ms: now_ms + 1_000,
            now_ms,
            expires_ms: now_ms + 60_000,
        }
    }

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// A SUBMITTING record at fence 5, as HGETALL pairs, with or without a live attempt.
    fn stored(attempt: Option<&str>) -> Value {
        let mut pairs = vec![
            ("key", "k"),
            ("route", "payouts"),
            ("fence", "5"),
            ("fingerprint", "fp"),
            ("state", "SUBMITTING"),
            ("attempt_expires_ms", "2000"),
            ("created_ms", "0"),
            ("updated_ms", "0"),
            ("expires_ms", "60000"),
        ];
        pairs.extend(attempt.map(|a| ("attempt", a)));
        Value::Array(
            pairs
                .into_iter()
                .flat_map(|(k, v)| [text(k), text(v)])
                .collect(),
        )
    }

    fn answer(verdict: &str, detail: Value, before: Value) -> Value {
        Value::Array(vec![text(verdict), detail, before])
    }

    #[test]
    fn begin_verdicts_are_checked_against_the_rule() {
        let idle = || stored(None);
        assert_eq!(
            read_begin(answer("resubmit", text("5"), idle()), &request(6, 1_500)).ok(),
            Some(Begun::Resubmit { previous_fence: 5 })
        );
        assert_eq!(
            read_begin(answer("superseded", text("5"), idle()), &request(4, 1_500)).ok(),
            Some(Begun::Superseded { fence: 5 })
        );
        assert_eq!(
            read_begin(
                answer("in_flight", Value::Int(500), stored(Some("other"))),
                &request(6, 1_500)
            )
            .ok(),
            Some(Begun::InFlight {
                retry_after_ms: 500
            })
        );
        assert_eq!(
            read_begin(
                answer("fresh", Value::Nil, Value::Array(vec![])),
                &request(1, 0)
            )
            .ok(),
            Some(Begun::Fresh)
        );
        // A script that let an attempt through while another was in flight, or that named the
        // wrong fence, is an error.
        let busy = stored(Some("other"));
        assert!(read_begin(answer("resubmit", text("5"), busy), &request(6, 1_500)).is_err());
        assert!(read_begin(answer("resubmit", text("4"), idle()), &request(6, 1_500)).is_err());
        assert!(read_begin(answer("maybe", Value::Nil, idle()), &request(6, 1_500)).is_err());
        assert!(read_begin(Value::Nil, &request(6, 1_500)).is_err());
    }

    #[test]
    fn records_with_missing_or_odd_fields_are_errors() {
        assert_eq!(read_record(Value::Array(vec![])).ok(), Some(None));
        let record = read_record(stored(Some("a"))).ok().flatten();
        assert_eq!(
            record.map(|r| (r.fence, r.attempt)),
            Some((5, Some("a".to_owned())))
        );
        let odd = Value::Array(vec![text("fence"), text("18446744073709551616")]);
        assert!(read_record(odd).is_err());
    }
}
