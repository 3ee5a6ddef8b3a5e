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
use super::script::{server_answer, unexpected};
use super::turn_scripts::TurnScripts;
use crate::store::expected::{mismatch_reason, ExpectedIdentity};
use crate::store::turns::{Renewal, TakeTurn, TurnStore};
use crate::store::{StoreError, StoreFuture};

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
