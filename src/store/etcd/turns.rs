//! Key turns on etcd: a key `{prefix}turn/{key}` holding `"{holder} {turn}"`, attached to an etcd
//! lease (shared with the other turns of its length taken within about a second, `leases.rs`), so
//! that the cluster deletes it when the lease ends (the leader's clock). A take writes the turn —
//! with the key's mark advanced in the same transaction when asked — only if the turn is still as
//! last seen (first: absent, so a free key takes one transaction, nested in the serving thread's
//! batch of takes, `takes.rs`) and the store identity holds; a release deletes it only if it is
//! still this turn, in the serving thread's batch of releases (`releases.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::advance::{identity_holds, identity_refusal, mark_found, raise_mark};
use super::error::{unexpected, wrap};
use super::keys::{decode_mark, Keys};
use super::leases::SharedLeases;
use super::releases::{run_releases, Release, ReleaseQueue};
use super::takes::{run_takes, QueuedTake};
use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{
    Compare, KeyValue, PutRequest, RangeRequest, RangeResponse, RequestOp, ResponseOp, TxnRequest,
    TxnResponse,
};
use crate::store::expected::ExpectedIdentity;
use crate::store::plumbing::batches::{call_batched, run_batches, QUEUE};
use crate::store::plumbing::per_thread::PerThread;
use crate::store::turns::{Renewal, TakeTurn, TurnStore};
use crate::store::{StoreError, StoreFuture};

/// Reads and compare-and-swaps of one take before it gives up (each lost race is another
/// replica taking or releasing the key in between).
const MAX_ATTEMPTS: usize = 8;

/// How long `close` waits for the queued releases to be written.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

pub struct EtcdTurns {
    client: Arc<EtcdClient>,
    keys: Keys,
    holder: String,
    expected: Arc<ExpectedIdentity>,
    leases: SharedLeases,
    releases: PerThread<ReleaseQueue>,
    takes: PerThread<mpsc::Sender<QueuedTake>>,
    max_batch: usize,
}

/// What one attempt at a take found.
enum Attempt {
    /// The turn is ours; the key's mark as found (advanced, when asked).
    Taken(Option<u64>),
    /// The turn was not as last seen: here it is now.
    Changed(Option<KeyValue>),
}

impl EtcdTurns {
    pub(super) fn new(
        client: Arc<EtcdClient>,
        keys: Keys,
        holder: &str,
        expected: Arc<ExpectedIdentity>,
        max_batch: usize,
    ) -> EtcdTurns {
        EtcdTurns {
            leases: SharedLeases::new(Arc::clone(&client)),
            client,
            keys,
            holder: holder.to_owned(),
            expected,
            releases: PerThread::new(),
            takes: PerThread::new(),
            max_batch,
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

    /// One attempt at a take, on the turn as last `seen` (`None`: absent). The first attempt,
    /// on a key as yet unread, goes in the serving thread's batch of takes (`takes.rs`).
    async fn try_take(
        &self,
        take: &TakeTurn,
        seen: Option<&KeyValue>,
        expected: Option<&str>,
    ) -> Result<Attempt, StoreError> {
        let lease = self.leases.for_turn(take.lease).await?;
        let txn = take_txn(&self.keys, self.me(take.turn), take, lease, seen, expected);
        // An error leaves unknown whether the turn was written: its lease lapses on its own.
        let answer: TxnResponse = match seen {
            None => self.batched(&take.key, txn).await?,
            Some(_) => self.client.call("/v3/kv/txn", &txn).await.map_err(wrap)?,
        };
        attempt_of(take, &answer, expected)
    }

    /// Sends a first attempt's transaction in the calling thread's batch of takes.
    async fn batched(&self, key: &str, txn: TxnRequest) -> Result<TxnResponse, StoreError> {
        let start = || {
            let client = Arc::clone(&self.client);
            move |batch| {
                let client = Arc::clone(&client);
                async move { run_takes(&client, batch).await }
            }
        };
        let limits = (self.max_batch, super::BATCHES_IN_FLIGHT);
        call_batched(&self.takes, limits, start, |reply| QueuedTake {
            key: key.to_owned(),
            txn,
            reply,
        })
        .await
    }
}

/// The transaction of one attempt at a take, writing `me` as the turn: write the turn (and raise
/// or read the mark) if the turn is still as `seen` and the store identity holds; else read both.
fn take_txn(
    keys: &Keys,
    me: String,
    take: &TakeTurn,
    lease: i64,
    seen: Option<&KeyValue>,
    expected: Option<&str>,
) -> TxnRequest {
    let turn_key = keys.turn(&take.key);
    let mark_key = keys.mark(&take.key);
    let mut compare = vec![Compare::modified_at(
        turn_key.as_str(),
        seen.map_or(0, |kv| kv.mod_revision),
    )];
    if let Some(id) = expected {
        compare.push(identity_holds(keys, id));
    }
    TxnRequest {
        compare,
        success: vec![
            RequestOp::Put(PutRequest {
                key: turn_key.as_str().into(),
                value: me.into(),
                lease,
                prev_kv: false,
            }),
            match take.advance {
                Some(token) => raise_mark(&mark_key, token, None),
                None => RequestOp::read(&mark_key),
            },
        ],
        // The identity record first (its refusal reads the first range), then the turn.
        failure: vec![
            RequestOp::read(&keys.store_id()),
            RequestOp::read(&turn_key),
        ],
    }
}

/// What one attempt's transaction ([`take_txn`]) answered.
fn attempt_of(
    take: &TakeTurn,
    answer: &TxnResponse,
    expected: Option<&str>,
) -> Result<Attempt, StoreError> {
    if !answer.succeeded {
        if let Some(id) = expected {
            let refusal = identity_refusal(answer, id);
            let holds = answer.responses.first().is_some_and(|op| {
                matches!(op, ResponseOp::Range(r)
                        if r.kvs.first().and_then(|kv| kv.value.text())
                            == Some(super::identity::record_of(id)))
            });
            if !holds {
                return Err(refusal);
            }
        }
        let now = match answer.responses.get(1) {
            Some(ResponseOp::Range(range)) => range.kvs.first().cloned(),
            other => return Err(unexpected(format!("a take's turn read answered {other:?}"))),
        };
        return Ok(Attempt::Changed(now));
    }
    let mark = match (take.advance, answer.responses.get(1)) {
        (Some(token), Some(op)) => mark_found(op, token)?,
        (None, Some(ResponseOp::Range(range))) => match range.kvs.first() {
            None => None,
            Some(kv) => Some(decode_mark(&kv.value.0).map_err(unexpected)?),
        },
        (_, other) => return Err(unexpected(format!("a take's mark answered {other:?}"))),
    };
    Ok(Attempt::Taken(mark))
}

impl TurnStore for EtcdTurns {
    fn take(&self, take: TakeTurn) -> StoreFuture<'_, Option<Option<u64>>> {
        Box::pin(async move {
            let expected = self.expected.get();
            // A free key is the common case: the first attempt takes it without reading it.
            let mut seen: Option<KeyValue> = None;
            for _ in 0..MAX_ATTEMPTS {
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
                match self
                    .try_take(&take, seen.as_ref(), expected.as_deref())
                    .await?
                {
                    Attempt::Taken(mark) => return Ok(Some(mark)),
                    Attempt::Changed(now) => seen = now,
                }
            }
            Err(unexpected(format!(
                "the turn of {} changed {MAX_ATTEMPTS} times while it was being taken",
                take.key
            )))
        })
    }

    fn release(&self, key: String, turn: u64, _lease: Duration) {
        let release = Release {
            turn_key: self.keys.turn(&key),
            holding: self.me(turn),
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let queue = self.releases.queue(|| {
            let (sender, releases) = mpsc::channel(QUEUE);
            // Dropped with the batcher, once it has written what was queued (or with its runtime).
            let (running, ended) = watch::channel(());
            let client = Arc::clone(&self.client);
            let batches = run_batches(
                releases,
                self.max_batch,
                super::BATCHES_IN_FLIGHT,
                move |batch| {
                    let client = Arc::clone(&client);
                    async move { run_releases(&client, batch).await }
                },
            );
            runtime.spawn(async move {
                batches.await;
                drop(running);
            });
            ReleaseQueue { sender, ended }
        });
        // Closed or full: written on its own, as it comes.
        let unqueued = match queue {
            Ok(queue) => queue.sender.try_send(release).err().map(|e| e.into_inner()),
            Err(_) => Some(release),
        };
        if let Some(release) = unqueued {
            let client = Arc::clone(&self.client);
            runtime.spawn(async move { run_releases(&client, vec![release]).await });
        }
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
        // A release batcher whose queue is dropped writes what was queued, then ends: waited for
        // here (a bounded while), so that no release queued before the close is lost with the
        // serving runtimes. Later releases are written one by one.
        let ended: Vec<watch::Receiver<()>> = self
            .releases
            .close()
            .into_iter()
            .map(|queue| queue.ended)
            .collect();
        Box::pin(async move {
            let all_ended =
                futures_util::future::join_all(ended.into_iter().map(|mut ended| async move {
                    // Only the batcher's end resolves it: nothing is ever sent.
                    let _ = ended.changed().await;
                }));
            if tokio::time::timeout(CLOSE_WAIT, all_ended).await.is_err() {
                tracing::warn!("etcd turn releases still being written at close: left to lapse");
            }
            Ok(())
        })
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
        let lease = self.leases.for_turn(renewal.lease).await?;
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
        Ok(answer.succeeded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_ETCD_MAX_BATCH;
    use crate::store::etcd::takes::batch_txn;
    use crate::store::etcd::within_max_txn_ops;

    /// The largest batch of takes the configuration allows, each advancing its key's mark under
    /// the identity comparison (the deepest take), fits etcd's default `--max-txn-ops` of 128.
    #[test]
    fn the_largest_batch_of_takes_fits_etcds_default_operation_limit() {
        let keys = Keys::new("fencegate/");
        let takes = |count: usize| {
            let txns = (0..count)
                .map(|i| {
                    let take = TakeTurn {
                        key: format!("key-{i}"),
                        turn: 1,
                        lease: Duration::from_secs(30),
                        advance: Some(7),
                    };
                    take_txn(&keys, "replica 1".to_owned(), &take, 1, None, Some("id"))
                })
                .collect();
            batch_txn(txns)
        };
        assert!(within_max_txn_ops(&takes(DEFAULT_ETCD_MAX_BATCH), 128));
        // Three levels below the batch: a take, its raise, the raise's second comparison.
        assert!(within_max_txn_ops(&takes(124), 128));
        assert!(!within_max_txn_ops(&takes(125), 128));
    }
}
