//! The Lua scripts that take, release and renew a key's turn, loaded by every writer connection
//! with the other scripts (`turns.rs` sends them).

use redis::Script;

use super::script::{DECIMAL_ORDER, IDENTITY_CHECK};

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
    pub(super) take: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
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
