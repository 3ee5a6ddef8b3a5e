//! Outcomes of the intents this gateway began fresh (in an advance's transaction, or by a begin
//! that found the key empty), recorded in batches: the record and the revision its transaction
//! wrote at are kept here until the outcome comes, so the
//! outcome is one compare-and-swap on that revision, joined with the calling thread's other
//! outcomes in one transaction, instead of a read and a transaction of its own. A record changed
//! since (another gateway took the intent over) fails its comparison and is recorded the usual
//! way, by reading it first.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::sync::oneshot;

use super::error::{unexpected, wrap};
use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{RequestOp, ResponseOp, TxnRequest, TxnResponse};
use crate::store::intents::IntentRecord;
use crate::store::StoreError;

/// Records kept at most: each is removed when its outcome (or abandonment) comes, and one whose
/// attempt has lapsed is dropped by the pruner or when the map is full, so this bounds only
/// attempts still in flight; beyond it, an outcome reads its record first.
const MAX_KEPT: usize = 64 * 1024;

/// The intents this gateway began fresh, by key: the record as written and the revision it was
/// written at.
#[derive(Default)]
pub(super) struct OwnBegins {
    records: DashMap<String, (IntentRecord, i64)>,
    /// When a full map was last swept (ms): at most once a second, so that a map full of
    /// attempts still in flight costs a request no scan.
    swept_ms: AtomicU64,
}

impl OwnBegins {
    pub(super) fn keep(&self, record: IntentRecord, revision: i64) {
        // The record was written just now: its update time is the clock to sweep by.
        let now_ms = record.updated_ms;
        if self.records.len() >= MAX_KEPT
            && now_ms >= self.swept_ms.load(Ordering::Relaxed).saturating_add(1_000)
        {
            self.swept_ms.store(now_ms, Ordering::Relaxed);
            self.forget_lapsed(now_ms);
        }
        if self.records.len() < MAX_KEPT {
            self.records.insert(record.key.clone(), (record, revision));
        }
    }

    /// Drops the records whose attempt had lapsed by `now_ms` (a request that ended without
    /// its outcome or abandonment reaching the store — dropped, or failed early): another
    /// gateway may have taken the intent over since, and its outcome, if it still comes, reads
    /// the record first. Answers how many were dropped.
    pub(super) fn forget_lapsed(&self, now_ms: u64) -> usize {
        let before = self.records.len();
        self.records
            .retain(|_, (record, _)| record.attempt_expires_ms > now_ms);
        before.saturating_sub(self.records.len())
    }

    /// The record kept for `key`, removed: an intent's record is swapped at most once this way.
    pub(super) fn take(&self, key: &str) -> Option<(IntentRecord, i64)> {
        self.records.remove(key).map(|(_, kept)| kept)
    }

    pub(super) fn forget(&self, key: &str) {
        self.records.remove(key);
    }
}

/// One outcome to record: a nested transaction that swaps the record only at the revision kept.
pub(super) struct OutcomeRequest {
    pub(super) intent_key: String,
    pub(super) swap: RequestOp,
    /// Whether the swap ran (`false`: the record changed since, or another outcome of the same
    /// key was in the batch; the caller records it the usual way).
    pub(super) reply: oneshot::Sender<Result<bool, StoreError>>,
}

/// Runs one batch of outcomes as one transaction; a key that appears twice goes in once, the
/// others are answered `false`.
pub(super) async fn run_outcomes(client: &EtcdClient, batch: Vec<OutcomeRequest>) {
    let mut seen = BTreeSet::new();
    let (joined, repeated): (Vec<OutcomeRequest>, Vec<OutcomeRequest>) = batch
        .into_iter()
        .partition(|request| seen.insert(request.intent_key.clone()));
    for request in repeated {
        let _ = request.reply.send(Ok(false));
    }
    let txn = TxnRequest {
        compare: Vec::new(),
        success: joined.iter().map(|r| r.swap.clone()).collect(),
        failure: Vec::new(),
    };
    let answer: Result<TxnResponse, StoreError> =
        client.call("/v3/kv/txn", &txn).await.map_err(wrap);
    let answer = answer.and_then(|answer| {
        if answer.responses.len() == joined.len() {
            Ok(answer.responses)
        } else {
            Err(unexpected(format!(
                "{} answers for {} outcomes",
                answer.responses.len(),
                joined.len()
            )))
        }
    });
    match answer {
        Ok(responses) => {
            for (request, response) in joined.into_iter().zip(responses) {
                let swapped = matches!(response, ResponseOp::Txn(t) if t.succeeded);
                let _ = request.reply.send(Ok(swapped));
            }
        }
        Err(error) => {
            for request in joined {
                let _ = request.reply.send(Err(error.again()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::intents::IntentState;

    fn record(key: &str, attempt_expires_ms: u64) -> IntentRecord {
        IntentRecord {
            key: key.to_owned(),
            route: "payouts".to_owned(),
            fence: 1,
            fingerprint: "fp".to_owned(),
            state: IntentState::Submitting,
            attempt: Some("attempt".to_owned()),
            attempt_expires_ms,
            created_ms: 0,
            updated_ms: 0,
            expires_ms: 60_000,
            outcome: None,
        }
    }

    /// A record whose request never came back is not kept past its attempt's lease.
    #[test]
    fn records_of_lapsed_attempts_are_forgotten() {
        let kept = OwnBegins::default();
        kept.keep(record("lapsed", 1_000), 5);
        kept.keep(record("live", 3_000), 6);
        assert_eq!(kept.forget_lapsed(2_000), 1);
        assert!(kept.take("lapsed").is_none());
        assert_eq!(
            kept.take("live").map(|(r, rev)| (r.key, rev)),
            Some(("live".to_owned(), 6))
        );
    }
}
