//! The compare-and-advance on etcd: one transaction per batch, holding one nested transaction per
//! key that raises the mark only when the key has none or its stored value orders below the
//! token, and answers the mark it found. The whole batch runs only while the store identity
//! record is the adopted one.

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::oneshot;

use super::error::{unexpected, wrap};
use super::keys::{decode_mark, encode_mark, Keys};
use crate::config::Compare as CompareMode;
use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{Compare, PutRequest, RequestOp, ResponseOp, TxnRequest, TxnResponse};
use crate::store::expected::mismatch_reason;
use crate::store::{decide, Advance, StoreError};

/// One advance asked of the store, answered on `reply`.
pub(super) struct AdvanceRequest {
    pub(super) key: String,
    pub(super) token: u64,
    pub(super) compare: CompareMode,
    /// An intent to create in the same transaction when this advance raises the mark.
    pub(super) begin: Option<BeginInBatch>,
    pub(super) reply: oneshot::Sender<Result<Advanced, StoreError>>,
}

/// The fresh intent an advance-and-begin writes beside its advance ([`super::intents`]'s
/// `begin_fresh`), and the key of its record, which a transaction may put only once.
pub(super) struct BeginInBatch {
    pub(super) intent_key: String,
    pub(super) create: RequestOp,
}

/// The answer to one [`AdvanceRequest`].
#[derive(Debug)]
pub(super) struct Advanced {
    pub(super) advance: Advance,
    /// The request's fresh intent was written in the advance's transaction. `false` when it had
    /// none, or it could not go there (another request of the batch on the same key or intent,
    /// a record already under its key, a token equal to the mark): its begin is then a call of
    /// its own.
    pub(super) begun: bool,
    /// The revision the batch's transaction wrote at: a record begun in it was last modified
    /// there.
    pub(super) revision: i64,
}

/// The nested transaction that raises `mark_key` to `token` unless its mark is already at
/// least that: put (answering the previous value) when the key is absent or below, else read.
/// `with_raise` runs beside the put, in the same branch, only when the mark is raised.
pub(super) fn raise_mark(mark_key: &str, token: u64, with_raise: Option<&RequestOp>) -> RequestOp {
    let stored = encode_mark(token);
    let put = || {
        let mut ops = vec![RequestOp::Put(PutRequest {
            key: mark_key.into(),
            value: stored.clone().into(),
            lease: 0,
            prev_kv: true,
        })];
        ops.extend(with_raise.cloned());
        ops
    };
    RequestOp::Txn(TxnRequest {
        compare: vec![Compare::absent(mark_key)],
        success: put(),
        failure: vec![RequestOp::Txn(TxnRequest {
            compare: vec![Compare::value_below(mark_key, stored.clone())],
            success: put(),
            failure: vec![RequestOp::read(mark_key)],
        })],
    })
}

/// Whether the operation [`raise_mark`] ran beside the put (the answer's second one, in the
/// branch that raised) is a transaction that succeeded.
pub(super) fn ran_with_raise(answer: &ResponseOp) -> bool {
    let ResponseOp::Txn(outer) = answer else {
        return false;
    };
    let raised = if outer.succeeded {
        outer
    } else {
        match outer.responses.first() {
            Some(ResponseOp::Txn(inner)) if inner.succeeded => inner,
            _ => return false,
        }
    };
    matches!(raised.responses.get(1), Some(ResponseOp::Txn(t)) if t.succeeded)
}

/// The mark a [`raise_mark`] found before it ran (`None`: the key had none), checked against
/// the token it was given: a put answers a mark below the token, a read one at or above it.
pub(super) fn mark_found(answer: &ResponseOp, token: u64) -> Result<Option<u64>, StoreError> {
    let ResponseOp::Txn(outer) = answer else {
        return Err(unexpected(format!("a mark's advance answered {answer:?}")));
    };
    if outer.succeeded {
        return match outer.responses.first() {
            Some(ResponseOp::Put(put)) if put.prev_kv.is_none() => Ok(None),
            other => Err(unexpected(format!("a first mark's put answered {other:?}"))),
        };
    }
    let Some(ResponseOp::Txn(inner)) = outer.responses.first() else {
        return Err(unexpected(format!(
            "a mark's comparison answered {outer:?}"
        )));
    };
    let (found, raised) = match inner.responses.first() {
        Some(ResponseOp::Put(put)) if inner.succeeded => {
            (put.prev_kv.as_ref().map(|kv| kv.value.0.as_slice()), true)
        }
        Some(ResponseOp::Range(range)) if !inner.succeeded => {
            (range.kvs.first().map(|kv| kv.value.0.as_slice()), false)
        }
        other => return Err(unexpected(format!("a mark's update answered {other:?}"))),
    };
    let Some(found) = found else {
        return Err(unexpected("a mark vanished inside its own transaction"));
    };
    let mark = decode_mark(found).map_err(unexpected)?;
    if raised != (mark < token) {
        return Err(unexpected(format!(
            "etcd {} mark {mark} for token {token}",
            if raised { "raised" } else { "kept" }
        )));
    }
    Ok(Some(mark))
}

/// The comparison that the store is still the adopted one (`expected`: its id as adopted).
pub(super) fn identity_holds(keys: &Keys, expected: &str) -> Compare {
    Compare::value_is(keys.store_id(), super::identity::record_of(expected))
}

/// Reads why a transaction guarded by [`identity_holds`] did not run: its failure branch read
/// the identity record.
pub(super) fn identity_refusal(answer: &TxnResponse, expected: &str) -> StoreError {
    let found = answer.responses.iter().find_map(|op| match op {
        ResponseOp::Range(range) => Some(
            range
                .kvs
                .first()
                .and_then(|kv| kv.value.text())
                .map(str::to_owned),
        ),
        _ => None,
    });
    StoreError::Untrusted {
        reason: mismatch_reason(
            super::identity::record_of(expected),
            found.flatten().as_deref(),
        ),
    }
}

/// A batch's transaction: under the identity comparison, one [`raise_mark`] per key with its
/// largest token, and beside each raise the fresh intent `begins` holds for that key.
pub(super) fn batch_txn(
    keys: &Keys,
    largest: &BTreeMap<&str, u64>,
    begins: &BTreeMap<&str, &RequestOp>,
    expected: Option<&str>,
) -> TxnRequest {
    TxnRequest {
        compare: expected
            .map(|id| vec![identity_holds(keys, id)])
            .unwrap_or_default(),
        success: largest
            .iter()
            .map(|(key, token)| raise_mark(&keys.mark(key), *token, begins.get(key).copied()))
            .collect(),
        failure: vec![RequestOp::read(&keys.store_id())],
    }
}

/// Runs one batch: one transaction, one nested transaction per key (with its largest token),
/// and answers every request of the batch in order, as if each had run alone in turn.
pub(super) async fn run_batch(
    client: &EtcdClient,
    keys: &Keys,
    batch: Vec<AdvanceRequest>,
    expected: Option<&str>,
) {
    let mut largest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut requests_of: BTreeMap<&str, usize> = BTreeMap::new();
    for request in &batch {
        let entry = largest.entry(request.key.as_str()).or_insert(request.token);
        *entry = (*entry).max(request.token);
        *requests_of.entry(request.key.as_str()).or_default() += 1;
    }
    // A fresh intent goes in the advance's transaction only for a key alone in the batch, and
    // only the first time its intent key appears (etcd refuses a key put twice in one branch).
    let mut intent_keys: BTreeSet<&str> = BTreeSet::new();
    let begins: BTreeMap<&str, &RequestOp> = batch
        .iter()
        .filter(|r| requests_of.get(r.key.as_str()) == Some(&1))
        .filter_map(|r| r.begin.as_ref().map(|b| (r.key.as_str(), b)))
        .filter(|(_, b)| intent_keys.insert(b.intent_key.as_str()))
        .map(|(key, b)| (key, &b.create))
        .collect();
    let txn = batch_txn(keys, &largest, &begins, expected);
    let answer: Result<TxnResponse, StoreError> =
        client.call("/v3/kv/txn", &txn).await.map_err(wrap);
    let found = answer.and_then(|answer| {
        if !answer.succeeded {
            return Err(match expected {
                Some(id) => identity_refusal(&answer, id),
                None => unexpected("an unconditional transaction did not run"),
            });
        }
        if answer.responses.len() != largest.len() {
            return Err(unexpected(format!(
                "{} answers for {} marks",
                answer.responses.len(),
                largest.len()
            )));
        }
        let revision = answer.header.revision;
        let found = largest
            .iter()
            .zip(&answer.responses)
            .map(|((key, token), op)| {
                let begun = begins.contains_key(key) && ran_with_raise(op);
                (key.to_string(), mark_found(op, *token).map(|m| (m, begun)))
            })
            .collect::<BTreeMap<String, Result<(Option<u64>, bool), StoreError>>>();
        Ok((found, revision))
    });
    let (mut found, revision) = match found {
        Ok(found) => found,
        Err(error) => {
            for request in batch {
                let _ = request.reply.send(Err(error.again()));
            }
            return;
        }
    };
    // Requests of one key, in the order they came: each sees the mark the ones before it left.
    for request in batch {
        let answer = match found.get_mut(&request.key) {
            Some(Ok((mark, begun))) => {
                let outcome = decide(*mark, request.token, request.compare);
                if let Advance::Accepted { .. } = outcome {
                    *mark = Some(mark.map_or(request.token, |m| m.max(request.token)));
                }
                // The intent was written only where the mark was raised, which this request's
                // token alone did: its advance is accepted.
                let begun = *begun && matches!(outcome, Advance::Accepted { .. });
                Ok(Advanced {
                    advance: outcome,
                    begun,
                    revision,
                })
            }
            Some(Err(error)) => Err(error.again()),
            None => Err(unexpected("a request's key was not in its batch")),
        };
        let _ = request.reply.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::wire::{KeyValue, PutResponse, RangeResponse};

    fn kv(mark: u64) -> KeyValue {
        KeyValue {
            value: encode_mark(mark).into(),
            ..Default::default()
        }
    }

    fn nested(succeeded: bool, inner: ResponseOp) -> ResponseOp {
        ResponseOp::Txn(TxnResponse {
            succeeded,
            responses: vec![inner],
            ..Default::default()
        })
    }

    #[test]
    fn answers_are_read_and_checked_against_the_token() {
        let first = nested(true, ResponseOp::Put(PutResponse { prev_kv: None }));
        assert_eq!(mark_found(&first, 5).ok(), Some(None));
        let raised = nested(
            false,
            nested(
                true,
                ResponseOp::Put(PutResponse {
                    prev_kv: Some(kv(4)),
                }),
            ),
        );
        assert_eq!(mark_found(&raised, 5).ok(), Some(Some(4)));
        let kept = nested(
            false,
            nested(
                false,
                ResponseOp::Range(RangeResponse {
                    kvs: vec![kv(5)],
                    ..Default::default()
                }),
            ),
        );
        assert_eq!(mark_found(&kept, 5).ok(), Some(Some(5)));
        // A store that raised a mark above the token, or kept one below it, is an error.
        assert!(mark_found(&raised, 4).is_err());
        assert!(mark_found(&kept, 6).is_err());
        assert!(mark_found(&ResponseOp::Put(PutResponse { prev_kv: None }), 1).is_err());
    }
}
