//! Key turns on etcd: a key `{prefix}turn/{key}` holding `"{holder} {turn}"`, attached to an etcd
//! lease of its own, so that the cluster deletes it when the lease ends (the leader's clock). A
//! take reads the turn, grants a lease, and writes the turn — with the key's mark advanced in the
//! same transaction when asked — only if the turn is still as read and the store identity holds.

use std::sync::Arc;
use std::time::Duration;

use super::advance::{identity_holds, identity_refusal, mark_found, raise_mark, read};
use super::error::{unexpected, wrap};
use super::keys::{decode_mark, Keys};
use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{
    Compare, Empty, KeyValue, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    PutRequest, RangeRequest, RangeResponse, RequestOp, ResponseOp, TxnRequest, TxnResponse,
};
use crate::store::guard::expected::ExpectedIdentity;
use crate::store::turns::{Renewal, TakeTurn, TurnStore};
use crate::store::{StoreError, StoreFuture};

/// Reads and compare-and-swaps of one take before it gives up (each lost race is another
/// replica taking or releasing the key in between).
const MAX_ATTEMPTS: usize = 8;

pub struct EtcdTurns {
    client: Arc<EtcdClient>,
    keys: Keys,
    holder: String,
    expected: Arc<ExpectedIdentity>,
}

/// Whole seconds of a lease, rounded up: etcd's leases count seconds, and a turn must not lapse
/// before the time it was taken for.
fn lease_seconds(lease: Duration) -> i64 {
    let seconds = lease.as_secs() + u64::from(lease.subsec_nanos() > 0);
    i64::try_from(seconds.max(1)).unwrap_or(i64::MAX)
}

impl EtcdTurns {
    pub(super) fn new(
        client: Arc<EtcdClient>,
        keys: Keys,
        holder: &str,
        expected: Arc<ExpectedIdentity>,
    ) -> EtcdTurns {
        EtcdTurns {
            client,
            keys,
            holder: holder.to_owned(),
            expected,
        }
    }

    fn me(&self, turn: u64) -> String {
        format!("{} {turn}", self.holder)
    }

    async fn read_turn(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let request = RangeRequest {
            key: self.keys.turn(key).into(),
            ..Default::default()
        };
        let answer: RangeResponse = self
            .client
            .call("/v3/kv/range", &request)
            .await
            .map_err(wrap)?;
        Ok(answer.kvs.into_iter().next())
    }

    /// A new lease of at least `lease` (etcd may grant more: its leases last at least about
    /// one and a half election timeouts).
    async fn grant(&self, lease: Duration) -> Result<i64, StoreError> {
        let ttl = lease_seconds(lease);
        let answer: LeaseGrantResponse = self
            .client
            .call("/v3/lease/grant", &LeaseGrantRequest { ttl })
            .await
            .map_err(wrap)?;
        if !answer.error.is_empty() || answer.id == 0 || answer.ttl < ttl {
            self.revoke_later(answer.id);
            return Err(unexpected(format!(
                "lease grant of {ttl}s answered lease {} of {}s {}",
                answer.id, answer.ttl, answer.error
            )));
        }
        Ok(answer.id)
    }

    /// Ends a lease no turn needs any more, in the background; one the cluster does not get
    /// lapses at its own end.
    fn revoke_later(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        let client = Arc::clone(&self.client);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _: Result<Empty, _> = client
                    .call("/v3/lease/revoke", &LeaseRevokeRequest { id: lease })
                    .await;
            });
        }
    }

    /// One attempt at a take; `Ok(None)` when the turn changed since it was read.
    async fn try_take(
        &self,
        take: &TakeTurn,
        seen: Option<&KeyValue>,
        expected: Option<&str>,
    ) -> Result<Option<Option<u64>>, StoreError> {
        let lease = self.grant(take.lease).await?;
        let turn_key = self.keys.turn(&take.key);
        let mark_key = self.keys.mark(&take.key);
        let mut compare = vec![Compare::modified_at(
            turn_key.as_str(),
            seen.map_or(0, |kv| kv.mod_revision),
        )];
        if let Some(id) = expected {
            compare.push(identity_holds(&self.keys, id));
        }
        let txn = TxnRequest {
            compare,
            success: vec![
                RequestOp::Put(PutRequest {
                    key: turn_key.as_str().into(),
                    value: self.me(take.turn).into(),
                    lease,
                    prev_kv: false,
                }),
                match take.advance {
                    Some(token) => raise_mark(&mark_key, token, None),
                    None => read(&mark_key),
                },
            ],
            failure: vec![read(&self.keys.store_id())],
        };
        let answer: Result<TxnResponse, _> = self.client.call("/v3/kv/txn", &txn).await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                // Whether the turn was written is unknown: its lease is left to lapse.
                return Err(wrap(e));
            }
        };
        if !answer.succeeded {
            self.revoke_later(lease);
            if let Some(id) = expected {
                let refusal = identity_refusal(&answer, id);
                let holds = answer.responses.iter().any(|op| {
                    matches!(op, ResponseOp::Range(r)
                        if r.kvs.first().and_then(|kv| kv.value.text())
                            == Some(super::identity::record_of(id)))
                });
                if !holds {
                    return Err(refusal);
                }
            }
            return Ok(None);
        }
        // The turn is ours under the new lease; the lease of an earlier turn of ours is not needed.
        if let Some(kv) = seen {
            self.revoke_later(kv.lease);
        }
        let mark = match (take.advance, answer.responses.get(1)) {
            (Some(token), Some(op)) => mark_found(op, token)?,
            (None, Some(ResponseOp::Range(range))) => match range.kvs.first() {
                None => None,
                Some(kv) => Some(decode_mark(&kv.value.0).map_err(unexpected)?),
            },
            (_, other) => return Err(unexpected(format!("a take's mark answered {other:?}"))),
        };
        Ok(Some(mark))
    }
}

impl TurnStore for EtcdTurns {
    fn take(&self, take: TakeTurn) -> StoreFuture<'_, Option<Option<u64>>> {
        Box::pin(async move {
            let expected = self.expected.get();
            for _ in 0..MAX_ATTEMPTS {
                let seen = self.read_turn(&take.key).await?;
                if let Some(kv) = &seen {
                    let value = kv.value.text().unwrap_or_default();
                    let ours = value
                        .strip_prefix(self.holder.as_str())
                        .is_some_and(|rest| rest.starts_with(' '));
                    if !ours {
                        return Ok(None);
                    }
                    if value == self.me(take.turn) && take.advance.is_some() {
                        return Err(unexpected(
                            "a repeated turn take with an advance: whether its token was new is unknown",
                        ));
                    }
                }
                if let Some(taken) = self
                    .try_take(&take, seen.as_ref(), expected.as_deref())
                    .await?
                {
                    return Ok(Some(taken));
                }
            }
            Err(unexpected(format!(
                "the turn of {} changed {MAX_ATTEMPTS} times while it was being taken",
                take.key
            )))
        })
    }

    fn release(&self, key: String, turn: u64, _lease: Duration) {
        let (client, turn_key, me) = (
            Arc::clone(&self.client),
            self.keys.turn(&key),
            self.me(turn),
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            // Deleted only if it is still this turn; its lease is ended with it.
            let txn = TxnRequest {
                compare: vec![Compare::value_is(turn_key.as_str(), me)],
                success: vec![
                    read(&turn_key),
                    RequestOp::DeleteRange(crate::etcd::wire::DeleteRangeRequest {
                        key: turn_key.as_str().into(),
                        range_end: Default::default(),
                    }),
                ],
                failure: Vec::new(),
            };
            let answer: Result<TxnResponse, _> = client.call("/v3/kv/txn", &txn).await;
            let lease = answer.ok().and_then(|a| match a.responses.first() {
                Some(ResponseOp::Range(r)) => r.kvs.first().map(|kv| kv.lease),
                _ => None,
            });
            if let Some(lease) = lease.filter(|l| *l != 0) {
                let _: Result<Empty, _> = client
                    .call("/v3/lease/revoke", &LeaseRevokeRequest { id: lease })
                    .await;
            }
        });
    }

    fn renew(&self, renewals: Vec<Renewal>) -> StoreFuture<'_, Vec<bool>> {
        Box::pin(async move {
            let mut renewed = Vec::with_capacity(renewals.len());
            for renewal in renewals {
                renewed.push(self.renew_one(&renewal).await?);
            }
            Ok(renewed)
        })
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        // Releases are written as they come.
        Box::pin(async { Ok(()) })
    }
}

impl EtcdTurns {
    /// Moves a turn still held by this replica onto a new lease of the asked length.
    async fn renew_one(&self, renewal: &Renewal) -> Result<bool, StoreError> {
        let Some(seen) = self.read_turn(&renewal.key).await? else {
            return Ok(false);
        };
        if seen.value.text() != Some(self.me(renewal.turn).as_str()) {
            return Ok(false);
        }
        let lease = self.grant(renewal.lease).await?;
        let turn_key = self.keys.turn(&renewal.key);
        let txn = TxnRequest {
            compare: vec![Compare::modified_at(turn_key.as_str(), seen.mod_revision)],
            success: vec![RequestOp::Put(PutRequest {
                key: turn_key.as_str().into(),
                value: self.me(renewal.turn).into(),
                lease,
                prev_kv: false,
            })],
            failure: Vec::new(),
        };
        let answer: TxnResponse = self.client.call("/v3/kv/txn", &txn).await.map_err(wrap)?;
        if answer.succeeded {
            self.revoke_later(seen.lease);
        } else {
            self.revoke_later(lease);
        }
        Ok(answer.succeeded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_whole_seconds_rounded_up() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1_000)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1_001)), 2);
        assert_eq!(lease_seconds(Duration::ZERO), 1);
    }
}
