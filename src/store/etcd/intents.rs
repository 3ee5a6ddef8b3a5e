//! Intent records on etcd: one JSON value per intent, and two index keys per record (SUBMITTING by
//! last update, every record by end of retention) so that listing and pruning read ranges, not
//! every record. Each change reads the record, decides in Rust (`decide_begin` and the settle
//! rules every backend shares), and writes the record and its index entries in one transaction
//! that holds only if the record is still at the revision read; a lost race reads again.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::advance::BeginInBatch;
use super::error::{unexpected, wrap};
use super::keys::Keys;
use super::EtcdStore;
use crate::config::Compare as CompareMode;
use crate::etcd::wire::{
    prefix_end, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    ResponseOp, TxnRequest, TxnResponse,
};
use crate::store::intents::{
    decide_begin, BeginRequest, Begun, IntentCensus, IntentRecord, IntentState, IntentStore,
    Resolution, StoredOutcome,
};
use crate::store::{Advance, AdvanceAndBegin, AdvancedAndBegun, StoreError, StoreFuture};

/// Reads and compare-and-swaps of one change before it gives up: each lost race means another
/// gateway changed the same intent in between, which the rules allow only a few times.
const MAX_ATTEMPTS: usize = 16;
/// Records read in one transaction when listing (below etcd's default `--max-txn-ops`, 128).
const READS_PER_TXN: usize = 100;

/// An intent as stored: the record's fields, the fence as a JSON number (exact for u64).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredIntent {
    key: String,
    route: String,
    fence: u64,
    fingerprint: String,
    state: IntentState,
    attempt: Option<String>,
    attempt_expires_ms: u64,
    created_ms: u64,
    updated_ms: u64,
    expires_ms: u64,
    outcome: Option<StoredOutcome>,
}

impl From<&IntentRecord> for StoredIntent {
    fn from(r: &IntentRecord) -> StoredIntent {
        StoredIntent {
            key: r.key.clone(),
            route: r.route.clone(),
            fence: r.fence,
            fingerprint: r.fingerprint.clone(),
            state: r.state,
            attempt: r.attempt.clone(),
            attempt_expires_ms: r.attempt_expires_ms,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            expires_ms: r.expires_ms,
            outcome: r.outcome.clone(),
        }
    }
}

impl From<StoredIntent> for IntentRecord {
    fn from(s: StoredIntent) -> IntentRecord {
        IntentRecord {
            key: s.key,
            route: s.route,
            fence: s.fence,
            fingerprint: s.fingerprint,
            state: s.state,
            attempt: s.attempt,
            attempt_expires_ms: s.attempt_expires_ms,
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
            expires_ms: s.expires_ms,
            outcome: s.outcome,
        }
    }
}

/// A record as read, with the revision a change must still find.
struct Found {
    record: IntentRecord,
    revision: i64,
}

fn decode(key: &str, value: &[u8]) -> Result<IntentRecord, StoreError> {
    serde_json::from_slice::<StoredIntent>(value)
        .map(IntentRecord::from)
        .map_err(|e| unexpected(format!("intent {key}: unreadable stored record: {e}")))
}

/// The index entries a record has.
fn index_entries(keys: &Keys, record: &IntentRecord) -> BTreeSet<String> {
    let mut entries = BTreeSet::from([keys.expiry(record.expires_ms, &record.key)]);
    if record.state == IntentState::Submitting {
        entries.insert(keys.submitting(record.updated_ms, &record.key));
    }
    entries
}

impl EtcdStore {
    async fn read_intent(&self, key: &str) -> Result<Option<Found>, StoreError> {
        match self.read(&self.keys.intent(key)).await? {
            None => Ok(None),
            Some(kv) => Ok(Some(Found {
                record: decode(key, &kv.value.0)?,
                revision: kv.mod_revision,
            })),
        }
    }

    /// Replaces `seen` (or its absence) by `new` (or nothing), with the index entries moved to
    /// match; `false` when the record changed since it was read.
    async fn swap_intent(
        &self,
        key: &str,
        seen: Option<&Found>,
        new: Option<&IntentRecord>,
    ) -> Result<bool, StoreError> {
        Ok(self.swap_intent_at(key, seen, new).await?.is_some())
    }

    /// [`Self::swap_intent`], answering the revision it wrote at (`None`: it did not run).
    async fn swap_intent_at(
        &self,
        key: &str,
        seen: Option<&Found>,
        new: Option<&IntentRecord>,
    ) -> Result<Option<i64>, StoreError> {
        self.check_open()?;
        let txn = TxnRequest {
            compare: vec![Compare::modified_at(
                self.keys.intent(key).as_str(),
                seen.map_or(0, |f| f.revision),
            )],
            success: intent_writes(&self.keys, key, seen.map(|f| &f.record), new)?,
            failure: Vec::new(),
        };
        let answer: TxnResponse = self.client.call("/v3/kv/txn", &txn).await.map_err(wrap)?;
        Ok(answer.succeeded.then_some(answer.header.revision))
    }

    /// Reads the record, lets `change` decide (an answer, and the record to store or `None`
    /// to leave it), and stores the decision if the record did not change meanwhile.
    async fn change_intent<T>(
        &self,
        key: &str,
        mut change: impl FnMut(Option<&IntentRecord>) -> (T, Option<Option<IntentRecord>>),
    ) -> Result<T, StoreError> {
        for _ in 0..MAX_ATTEMPTS {
            let seen = self.read_intent(key).await?;
            let (answer, write) = change(seen.as_ref().map(|f| &f.record));
            let Some(new) = write else {
                return Ok(answer);
            };
            if self.swap_intent(key, seen.as_ref(), new.as_ref()).await? {
                return Ok(answer);
            }
        }
        Err(unexpected(format!(
            "intent {key}: changed by others {MAX_ATTEMPTS} times while this change was made"
        )))
    }

    /// One range read.
    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StoreError> {
        self.check_open()?;
        self.client
            .call("/v3/kv/range", &request)
            .await
            .map_err(wrap)
    }

    /// Every key under `prefix`: at most `limit` of them (0: all), or only their count.
    async fn prefix_range(
        &self,
        prefix: &str,
        limit: i64,
        count_only: bool,
    ) -> Result<RangeResponse, StoreError> {
        self.range(RangeRequest {
            key: prefix.into(),
            range_end: prefix_end(prefix.as_bytes()).into(),
            limit,
            count_only,
        })
        .await
    }

    /// The index entries under `prefix` that order before `bound`, oldest first.
    async fn index_range(
        &self,
        prefix: &str,
        bound: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let answer = self
            .range(RangeRequest {
                key: prefix.into(),
                range_end: bound.into(),
                limit: i64::try_from(limit).unwrap_or(i64::MAX),
                count_only: false,
            })
            .await?;
        Ok(answer
            .kvs
            .into_iter()
            .filter_map(|kv| kv.key.text().map(str::to_owned))
            .collect())
    }

    /// The records of `keys`, read a transaction at a time; absent ones are left out.
    async fn read_intents(&self, keys: &[String]) -> Result<Vec<IntentRecord>, StoreError> {
        let mut records = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(READS_PER_TXN) {
            let txn = TxnRequest {
                compare: Vec::new(),
                success: chunk
                    .iter()
                    .map(|k| RequestOp::read(&self.keys.intent(k)))
                    .collect(),
                failure: Vec::new(),
            };
            let answer: TxnResponse = self.client.call("/v3/kv/txn", &txn).await.map_err(wrap)?;
            for (key, op) in chunk.iter().zip(&answer.responses) {
                let ResponseOp::Range(range) = op else {
                    return Err(unexpected(format!("a read answered {op:?}")));
                };
                if let Some(kv) = range.kvs.first() {
                    records.push(decode(key, &kv.value.0)?);
                }
            }
        }
        Ok(records)
    }
}

/// The writes that replace `before` (or its absence) by `after` (or nothing) under `key`: the
/// record, and its index entries moved to match.
fn intent_writes(
    keys: &Keys,
    key: &str,
    before: Option<&IntentRecord>,
    after: Option<&IntentRecord>,
) -> Result<Vec<RequestOp>, StoreError> {
    let record_key = keys.intent(key);
    let entries_before = before.map(|r| index_entries(keys, r)).unwrap_or_default();
    let entries_after = after.map(|r| index_entries(keys, r)).unwrap_or_default();
    let mut writes: Vec<RequestOp> = entries_before
        .difference(&entries_after)
        .map(|entry| delete(entry))
        .collect();
    writes.extend(entries_after.difference(&entries_before).map(|entry| {
        RequestOp::Put(PutRequest {
            key: entry.as_str().into(),
            value: Default::default(),
            lease: 0,
            prev_kv: false,
        })
    }));
    writes.push(match after {
        Some(record) => {
            let value = serde_json::to_vec(&StoredIntent::from(record))
                .map_err(|e| unexpected(format!("intent {key}: {e}")))?;
            RequestOp::Put(PutRequest {
                key: record_key.as_str().into(),
                value: crate::etcd::wire::Bytes(value),
                lease: 0,
                prev_kv: false,
            })
        }
        None => delete(&record_key),
    });
    Ok(writes)
}

/// The nested transaction that creates the fresh record `begin` asks for, only where its key has
/// no record at all: an advance-and-begin's second half. Anything else (a record under the key,
/// live or expired) is left to a begin of its own, which reads it first.
/// Answers the operation and the record it writes.
fn begin_fresh(keys: &Keys, begin: &BeginRequest) -> Result<(RequestOp, IntentRecord), StoreError> {
    let (_, record) = decide_begin(None, begin);
    let record = record.ok_or_else(|| unexpected("a begin on no record wrote nothing"))?;
    let create = RequestOp::Txn(TxnRequest {
        compare: vec![Compare::absent(keys.intent(&begin.key).as_str())],
        success: intent_writes(keys, &begin.key, None, Some(&record))?,
        failure: Vec::new(),
    });
    Ok((create, record))
}

fn delete(key: &str) -> RequestOp {
    RequestOp::DeleteRange(DeleteRangeRequest {
        key: key.into(),
        range_end: Default::default(),
    })
}

/// The record after an outcome is recorded for it.
fn completed(record: &IntentRecord, outcome: StoredOutcome, now_ms: u64) -> IntentRecord {
    IntentRecord {
        state: IntentState::Completed,
        outcome: Some(outcome),
        attempt: None,
        updated_ms: now_ms,
        ..record.clone()
    }
}

impl IntentStore for EtcdStore {
    fn begin(&self, request: BeginRequest) -> StoreFuture<'_, Begun> {
        Box::pin(async move {
            let key = request.key.clone();
            // Most keys are new: the fresh record goes first where the key has none, without a
            // read, and is kept for its outcome's compare-and-swap; anything else reads first.
            let (verdict, fresh) = decide_begin(None, &request);
            if let Some(fresh) = fresh {
                if let Some(revision) = self.swap_intent_at(&key, None, Some(&fresh)).await? {
                    self.own_begins.keep(fresh, revision);
                    return Ok(verdict);
                }
            }
            self.change_intent(&key, |existing| {
                let (verdict, record) = decide_begin(existing, &request);
                (verdict, record.map(Some))
            })
            .await
        })
    }

    fn complete(&self, key: &str, outcome: StoredOutcome, now_ms: u64) -> StoreFuture<'_, bool> {
        let key = key.to_owned();
        Box::pin(async move {
            if let Some((record, revision)) = self.own_begins.take(&key) {
                let after = completed(&record, outcome.clone(), now_ms);
                let swap = RequestOp::Txn(TxnRequest {
                    compare: vec![Compare::modified_at(
                        self.keys.intent(&key).as_str(),
                        revision,
                    )],
                    success: intent_writes(&self.keys, &key, Some(&record), Some(&after))?,
                    failure: Vec::new(),
                });
                if self.outcome_batched(&key, swap).await? {
                    return Ok(true);
                }
            }
            self.change_intent(&key, |existing| match existing {
                Some(r) if r.state == IntentState::Submitting => {
                    (true, Some(Some(completed(r, outcome.clone(), now_ms))))
                }
                _ => (false, None),
            })
            .await
        })
    }

    fn abandon(&self, key: &str, attempt: &str, now_ms: u64) -> StoreFuture<'_, ()> {
        let (key, attempt) = (key.to_owned(), attempt.to_owned());
        self.own_begins.forget(&key);
        Box::pin(async move {
            self.change_intent(&key, |existing| match existing {
                Some(r)
                    if r.state == IntentState::Submitting
                        && r.attempt.as_deref() == Some(attempt.as_str()) =>
                {
                    let ended = IntentRecord {
                        attempt: None,
                        updated_ms: now_ms,
                        ..r.clone()
                    };
                    ((), Some(Some(ended)))
                }
                _ => ((), None),
            })
            .await
        })
    }

    fn get(&self, key: &str) -> StoreFuture<'_, Option<IntentRecord>> {
        let key = key.to_owned();
        Box::pin(async move { Ok(self.read_intent(&key).await?.map(|f| f.record)) })
    }

    fn list_submitting(
        &self,
        updated_before_ms: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<IntentRecord>> {
        Box::pin(async move {
            let prefix = self.keys.submitting_prefix();
            let bound = Keys::index_bound(&prefix, updated_before_ms);
            let entries = self.index_range(&prefix, &bound, limit).await?;
            let keys: Vec<String> = entries
                .iter()
                .filter_map(|e| Keys::parse_index(&prefix, e).map(|(_, key)| key))
                .collect();
            // An entry may be stale for a moment only if a change was lost half-way, which one
            // transaction rules out; the records are still checked.
            let mut records: Vec<IntentRecord> = self
                .read_intents(&keys)
                .await?
                .into_iter()
                .filter(|r| r.state == IntentState::Submitting && r.updated_ms < updated_before_ms)
                .collect();
            records.sort_by(|a, b| (a.updated_ms, &a.key).cmp(&(b.updated_ms, &b.key)));
            records.truncate(limit);
            Ok(records)
        })
    }

    fn census(&self) -> StoreFuture<'_, IntentCensus> {
        Box::pin(async move {
            // The index is ordered by last update: its first entry is the oldest, and the
            // range's count (whatever the limit) is the number of SUBMITTING intents.
            let prefix = self.keys.submitting_prefix();
            let answer = self.prefix_range(&prefix, 1, false).await?;
            let oldest = answer.kvs.first().and_then(|kv| kv.key.text());
            let submitting = u64::try_from(answer.count).unwrap_or(0);
            // Every record has an entry in the expiry index until it is pruned.
            let all = self
                .prefix_range(&self.keys.expiry_prefix(), 0, true)
                .await?;
            Ok(IntentCensus {
                submitting,
                oldest_submitting_ms: oldest
                    .and_then(|entry| Keys::parse_index(&prefix, entry))
                    .map(|(ms, _)| ms),
                completed: u64::try_from(all.count)
                    .unwrap_or(0)
                    .saturating_sub(submitting),
            })
        })
    }

    fn resolve(&self, key: &str, resolution: Resolution, now_ms: u64) -> StoreFuture<'_, bool> {
        let key = key.to_owned();
        self.own_begins.forget(&key);
        Box::pin(async move {
            self.change_intent(&key, |existing| match (existing, &resolution) {
                (Some(r), Resolution::Outcome(outcome)) if r.state == IntentState::Submitting => {
                    (true, Some(Some(completed(r, outcome.clone(), now_ms))))
                }
                (Some(r), Resolution::Release) if r.state == IntentState::Submitting => {
                    (true, Some(None))
                }
                _ => (false, None),
            })
            .await
        })
    }

    fn prune(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, usize> {
        // Kept records of requests that ended without an outcome go with their attempt's lease.
        self.own_begins.forget_lapsed(now_ms);
        Box::pin(async move {
            let prefix = self.keys.expiry_prefix();
            let bound = Keys::index_bound(&prefix, now_ms.saturating_add(1));
            let entries = self.index_range(&prefix, &bound, limit).await?;
            let mut pruned = 0;
            for entry in entries {
                let Some((_, key)) = Keys::parse_index(&prefix, &entry) else {
                    continue;
                };
                let removed = self
                    .change_intent(&key, |existing| match existing {
                        Some(r) if r.expires_ms <= now_ms => (true, Some(None)),
                        _ => (false, None),
                    })
                    .await?;
                if removed {
                    pruned += 1;
                } else {
                    // No record, or a newer one under the key: the entry is left from neither.
                    let still = self.read_intent(&key).await?;
                    let current = still.map(|f| index_entries(&self.keys, &f.record));
                    if !current.is_some_and(|entries| entries.contains(&entry)) {
                        self.drop_entry(&entry).await?;
                    }
                }
            }
            Ok(pruned)
        })
    }
}

impl AdvanceAndBegin for EtcdStore {
    /// One transaction of the calling thread's advance batch: the advance and, when it raises the
    /// mark and the intent's key has no record, the fresh record with its index entries. Any
    /// other accepted advance begins with a call of its own, as if the two had not been joined.
    fn advance_and_begin(
        &self,
        key: &str,
        token: u64,
        compare: CompareMode,
        begin: BeginRequest,
    ) -> StoreFuture<'_, AdvancedAndBegun> {
        let key = key.to_owned();
        Box::pin(async move {
            // A record that cannot be encoded fails its own begin below, not the advance.
            let (in_batch, record) = match begin_fresh(&self.keys, &begin) {
                Ok((create, record)) => (
                    Some(BeginInBatch {
                        intent_key: begin.key.clone(),
                        create,
                    }),
                    Some(record),
                ),
                Err(_) => (None, None),
            };
            let advanced = self.advance_batched(&key, token, compare, in_batch).await?;
            let begun = match (advanced.advance, record) {
                (Advance::Stale { .. }, _) => None,
                (Advance::Accepted { .. }, Some(record)) if advanced.begun => {
                    self.own_begins.keep(record, advanced.revision);
                    Some(Ok(Begun::Fresh))
                }
                (Advance::Accepted { .. }, _) => Some(self.begin(begin).await),
            };
            Ok(AdvancedAndBegun {
                advance: advanced.advance,
                begun,
            })
        })
    }
}

impl EtcdStore {
    /// Deletes one index entry that no record has.
    async fn drop_entry(&self, entry: &str) -> Result<(), StoreError> {
        let request = DeleteRangeRequest {
            key: entry.into(),
            range_end: Default::default(),
        };
        let _: crate::etcd::wire::Empty = self
            .client
            .call("/v3/kv/deleterange", &request)
            .await
            .map_err(wrap)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::DEFAULT_ETCD_MAX_BATCH;
    use crate::store::etcd::advance::batch_txn;
    use crate::store::etcd::within_max_txn_ops;

    /// The largest batch the configuration allows, every key beginning a fresh intent beside its
    /// advance (the deepest transaction the gateway writes), fits etcd's default
    /// `--max-txn-ops` of 128; one more begin's index entry, or a few more keys, would not.
    #[test]
    fn the_largest_advance_batch_fits_etcds_default_operation_limit() {
        let keys = Keys::new("fencegate/");
        let names: Vec<String> = (0..DEFAULT_ETCD_MAX_BATCH)
            .map(|i| format!("key-{i}"))
            .collect();
        let creates: Vec<RequestOp> = names
            .iter()
            .map(|name| {
                let begin = BeginRequest {
                    key: format!("intent-{name}"),
                    route: "payouts".to_owned(),
                    fence: 7,
                    fingerprint: "fp".to_owned(),
                    attempt: "attempt".to_owned(),
                    attempt_expires_ms: 2_000,
                    now_ms: 1_000,
                    expires_ms: 60_000,
                };
                begin_fresh(&keys, &begin).expect("fresh").0
            })
            .collect();
        let largest: BTreeMap<&str, u64> = names.iter().map(|n| (n.as_str(), 7)).collect();
        let begins: BTreeMap<&str, &RequestOp> =
            names.iter().map(|n| n.as_str()).zip(&creates).collect();
        let txn = batch_txn(&keys, &largest, &begins, Some("store-id"));
        assert!(within_max_txn_ops(&txn, 128));
        // The margin is small: two levels of raise plus the begin's three writes.
        let mut wider = names.clone();
        wider.extend((0..2).map(|i| format!("more-{i}")));
        let wider_largest: BTreeMap<&str, u64> = wider.iter().map(|n| (n.as_str(), 7)).collect();
        let wider_begins: BTreeMap<&str, &RequestOp> = wider
            .iter()
            .map(|n| n.as_str())
            .zip(creates.iter().cycle())
            .collect();
        let txn = batch_txn(&keys, &wider_largest, &wider_begins, Some("store-id"));
        assert!(!within_max_txn_ops(&txn, 128));
    }
}
