//! The Lua script that compares and sets one mark atomically, and the Rust-side decoding of every
//! answer the writer's pipeline gets back (advance, read, identity), each checked before it is
//! believed.

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::config::Compare;
use crate::store::{decide, Advance, StoreIdentity};

/// Compare-and-set of many marks in one call, in order: one script call per writer batch instead of
/// one per advance, which is most of what an advance costs the server. Lua numbers are doubles and
/// cannot hold every u64, so marks and tokens are compared as decimal strings: leading zeros
/// dropped, then shorter is smaller, then digit by digit. Writes only when the mark grows, so an
/// equal `monotonic` token costs no write.
pub(super) fn advance_script() -> String {
    format!("{DECIMAL_ORDER}{IDENTITY_CHECK}{ADVANCE_FUNCTION}{ADVANCE_LOOP}")
}

/// The store identity check every writing script starts with: KEYS[1] is the store's identity
/// record, ARGV[1] the adopted store's id ('' compares nothing). A store whose record is not that
/// id answers {-2, the id found or false} and the script writes nothing.
pub(super) const IDENTITY_CHECK: &str = r"
if ARGV[1] ~= '' then
  local found = redis.call('GET', KEYS[1])
  if found ~= ARGV[1] then
    return {-2, found or false}
  end
end
";

/// Orders u64 decimal strings (shared by every script that compares fences): leading zeros
/// dropped, then shorter is smaller, then digit by digit.
pub(super) const DECIMAL_ORDER: &str = r"
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
";

/// One compare-and-set of a mark, as a Lua function `advance(mark_key, token_text, compare)`;
/// needs [`DECIMAL_ORDER`].
pub(super) const ADVANCE_FUNCTION: &str = r"
-- One advance: {1, previous mark or false} when the token passes, {0, current mark} when it is
-- stale, {-1, message} when the token or the stored mark is not a decimal number.
local function advance(mark_key, token_text, compare)
  local token = canonical(token_text)
  if not token then
    return {-1, 'fencegate: the token is not a decimal number'}
  end
  if compare ~= 'strict' and compare ~= 'monotonic' then
    return {-1, 'fencegate: unknown compare mode'}
  end
  local stored = redis.call('GET', mark_key)
  if not stored then
    redis.call('SET', mark_key, token)
    return {1, false}
  end
  local mark = canonical(stored)
  if not mark then
    return {-1, 'fencegate: the stored mark is not a decimal number'}
  end
  local cmp = order(token, mark)
  local passes
  if compare == 'strict' then
    passes = cmp > 0
  else
    passes = cmp >= 0
  end
  if not passes then
    return {0, mark}
  end
  if cmp > 0 then
    redis.call('SET', mark_key, token)
  end
  return {1, mark}
end
";

/// The advances of one call, run after [`DECIMAL_ORDER`], [`IDENTITY_CHECK`] and
/// [`ADVANCE_FUNCTION`].
const ADVANCE_LOOP: &str = r"
-- KEYS[1] and ARGV[1]: the identity check's.
-- KEYS[i + 1]: the mark of the i-th advance; ARGV[2i]: its token (decimal u64), ARGV[2i + 1]:
-- 'monotonic' or 'strict'. One answer per advance, in order.
local answers = {}
for i = 1, #KEYS - 1 do
  answers[i] = advance(KEYS[i + 1], ARGV[2 * i], ARGV[2 * i + 1])
end
return answers
";

pub(super) fn compare_arg(compare: Compare) -> &'static str {
    match compare {
        Compare::Monotonic => "monotonic",
        Compare::Strict => "strict",
    }
}

pub(super) fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

/// A per-command answer that is a server error becomes that error.
pub(super) fn server_answer(reply: Value) -> Result<Value, RedisError> {
    match reply {
        Value::ServerError(e) => Err(e.into()),
        other => Ok(other),
    }
}

/// What one call of the advance script answered.
#[derive(Debug)]
pub(super) enum AdvanceAnswers {
    /// One answer per advance, in order.
    Each(Vec<Value>),
    /// The store's identity record is not the adopted one (`found`: the id it holds, if any).
    Wiped { found: Option<String> },
}

/// Splits the script's answer into one answer per advance: `count` of them, the identity
/// refusal, or an error for the whole call (a server error, or an answer of another shape).
pub(super) fn split_advances(reply: Value, count: usize) -> Result<AdvanceAnswers, RedisError> {
    match server_answer(reply)? {
        Value::Array(answers) if matches!(answers.first(), Some(Value::Int(-2))) => {
            let found = answers.into_iter().nth(1).unwrap_or(Value::Nil);
            Ok(AdvanceAnswers::Wiped {
                found: redis::from_redis_value(found)?,
            })
        }
        Value::Array(answers) if answers.len() == count => Ok(AdvanceAnswers::Each(answers)),
        other => Err(unexpected(format!(
            "the advance script answered {other:?} for {count} advances"
        ))),
    }
}

/// Reads one advance's answer and checks it against [`decide`]: a script that disagrees with the
/// comparison rule is an error, never an answer.
pub(super) fn read_advance(
    reply: Value,
    token: u64,
    compare: Compare,
) -> Result<Advance, RedisError> {
    let (passed, mark): (i64, Option<String>) = redis::from_redis_value(server_answer(reply)?)?;
    if passed == -1 {
        return Err(unexpected(mark.unwrap_or_default()));
    }
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

pub(super) fn read_mark(reply: Value) -> Result<Option<u64>, RedisError> {
    let mark: Option<String> = redis::from_redis_value(server_answer(reply)?)?;
    mark.as_deref().map(parse_mark).transpose()
}

pub(super) fn read_identity(set: Value, get: Value) -> Result<StoreIdentity, RedisError> {
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

pub(super) fn unexpected(detail: String) -> RedisError {
    RedisError::from((ErrorKind::UnexpectedReturnType, "unexpected answer", detail))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // The script's own refusal of one advance.
        let refused = Value::Array(vec![
            Value::Int(-1),
            Value::BulkString(b"fencegate: the stored mark is not a decimal number".to_vec()),
        ]);
        let error = read_advance(refused, 1, Compare::Strict).expect_err("refused");
        assert!(error.to_string().contains("stored mark"), "{error}");
    }

    #[test]
    fn a_batch_answer_has_one_answer_per_advance() {
        let one = || Value::Array(vec![Value::Int(1), Value::Nil]);
        assert!(matches!(
            split_advances(Value::Array(vec![one(), one()]), 2),
            Ok(AdvanceAnswers::Each(answers)) if answers.len() == 2
        ));
        assert!(matches!(
            split_advances(Value::Array(vec![Value::Int(-2), Value::Nil]), 2),
            Ok(AdvanceAnswers::Wiped { found: None })
        ));
        assert!(split_advances(Value::Array(vec![one()]), 2).is_err());
        assert!(split_advances(Value::Nil, 1).is_err());
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
