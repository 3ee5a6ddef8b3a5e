//! Locks in etcd, as etcd's own recipe takes them: contenders put `<lock>/<lease>` under their
//! lease, the one with the lowest create revision holds the lock, and that revision is its
//! fencing token (a lock may also be one key, its create revision the token). Followed by a
//! range of the locks' prefix, then a watch from the range's revision, with a probe every
//! [`PROBE_EVERY`] that also notices a watch that fell behind.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::mapping::LockMapping;
use super::settings::AuthoritySettings;
use super::source::{follow_sessions, Feed, LockSource};
use super::view::Holder;
use crate::config::EtcdStoreConfig;
use crate::etcd::client::EtcdClient;
use crate::etcd::wire::{
    prefix_end, EventKind, RangeRequest, RangeResponse, RequestOp, ResponseOp, TxnRequest,
    TxnResponse, WatchAnswer, WatchCreateRequest, WatchRequest,
};

/// How often the cluster is asked whether it still answers (and how many lock keys it holds).
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Ranges per confirm transaction, below etcd's default `--max-txn-ops` (128).
const RANGES_PER_TXN: usize = 100;

/// Opens a fresh etcd client for an authority.
pub(super) struct EtcdLocks {
    client: EtcdClient,
    mapping: LockMapping,
    prefix: Vec<u8>,
}

impl EtcdLocks {
    pub(super) fn new(
        config: &EtcdStoreConfig,
        password: Option<String>,
        settings: &AuthoritySettings,
    ) -> Result<EtcdLocks, String> {
        let client = EtcdClient::new(config, password).map_err(|e| e.to_string())?;
        Ok(EtcdLocks {
            client,
            mapping: settings.mapping.clone(),
            prefix: settings.mapping.lock_prefix().as_bytes().to_vec(),
        })
    }

    /// One range-then-watch session; returns why it ended.
    async fn session(&self, feed: &Feed) -> String {
        let range = RangeRequest {
            key: self.prefix.clone().into(),
            range_end: prefix_end(&self.prefix).into(),
            ..Default::default()
        };
        let answer: RangeResponse = match self.client.call("/v3/kv/range", &range).await {
            Ok(answer) => answer,
            Err(e) => return format!("reading the locks: {e}"),
        };
        let mut contenders = Contenders::default();
        for kv in &answer.kvs {
            if let Some(key) = kv.key.text() {
                contenders.put(&self.mapping, key, kv.create_revision);
            }
        }
        let revision = answer.header.revision;
        let watch = WatchRequest {
            create_request: WatchCreateRequest {
                key: self.prefix.clone().into(),
                range_end: prefix_end(&self.prefix).into(),
                start_revision: revision + 1,
                progress_notify: true,
            },
        };
        let mut stream = match self.client.stream("/v3/watch", &watch).await {
            Ok(stream) => stream,
            Err(e) => return format!("starting the watch: {e}"),
        };
        feed.resync(contenders.holders(), revision);
        let mut probes = tokio::time::interval(PROBE_EVERY);
        probes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        probes.tick().await;
        // A count that differs from the view's on two probes in a row: the watch fell behind.
        let mut mismatched = false;
        loop {
            tokio::select! {
                answer = stream.next::<WatchAnswer>() => {
                    let answer = match answer {
                        None => return "the watch was closed".to_owned(),
                        Some(Err(e)) => return format!("the watch broke: {e}"),
                        Some(Ok(answer)) => answer,
                    };
                    if let Some(error) = answer.error {
                        return format!("the watch broke: {} {}", error.code, error.message);
                    }
                    let Some(result) = answer.result else { continue };
                    if result.canceled || result.compact_revision > 0 {
                        return format!(
                            "the watch was cancelled ({}; compacted at {})",
                            result.cancel_reason, result.compact_revision
                        );
                    }
                    let mut touched = BTreeSet::new();
                    for event in &result.events {
                        let Some(key) = event.kv.key.text() else { continue };
                        let lock = match event.kind {
                            EventKind::Put => contenders.put(&self.mapping, key, event.kv.create_revision),
                            EventKind::Delete => contenders.delete(key),
                        };
                        touched.extend(lock);
                    }
                    let changes = touched
                        .into_iter()
                        .filter_map(|lock| contenders.holder_of(&lock))
                        .collect();
                    // The revision every event up to which was applied: the last event's, or
                    // for a progress answer (no events) the header's. The creation answer comes
                    // before events older than its header: it reaches nothing.
                    let progress = if result.created { 0 } else { result.header.revision };
                    let reached = result
                        .events
                        .iter()
                        .map(|e| e.kv.mod_revision)
                        .max()
                        .unwrap_or(progress);
                    feed.apply(changes, reached);
                }
                _ = probes.tick() => {
                    let count = RangeRequest {
                        key: self.prefix.clone().into(),
                        range_end: prefix_end(&self.prefix).into(),
                        count_only: true,
                        ..Default::default()
                    };
                    match self.client.call::<_, RangeResponse>("/v3/kv/range", &count).await {
                        Err(e) => return format!("the lock service stopped answering: {e}"),
                        Ok(answer) => {
                            let differs = usize::try_from(answer.count).ok() != Some(contenders.stored_keys());
                            if differs && mismatched {
                                return "the watch fell behind the lock keys; reading them again".to_owned();
                            }
                            mismatched = differs;
                        }
                    }
                }
            }
        }
    }

    async fn read_holders(&self, locks: &[String]) -> Result<Vec<Option<u64>>, String> {
        let mut holders = Vec::with_capacity(locks.len());
        for chunk in locks.chunks(RANGES_PER_TXN) {
            let txn = TxnRequest {
                compare: Vec::new(),
                success: chunk
                    .iter()
                    .map(|lock| {
                        RequestOp::Range(RangeRequest {
                            key: lock.as_bytes().to_vec().into(),
                            range_end: prefix_end(format!("{lock}/").as_bytes()).into(),
                            ..Default::default()
                        })
                    })
                    .collect(),
                failure: Vec::new(),
            };
            let answer: TxnResponse = self
                .client
                .call("/v3/kv/txn", &txn)
                .await
                .map_err(|e| format!("confirming holders: {e}"))?;
            if answer.responses.len() != chunk.len() {
                return Err("confirming holders: an answer per lock was expected".to_owned());
            }
            for (lock, response) in chunk.iter().zip(&answer.responses) {
                let ResponseOp::Range(range) = response else {
                    return Err("confirming holders: a range answer was expected".to_owned());
                };
                let holder = range
                    .kvs
                    .iter()
                    .filter(|kv| {
                        kv.key.text().is_some_and(|key| {
                            self.mapping
                                .lock_of_key(key)
                                .is_some_and(|(of, _)| of == *lock)
                        })
                    })
                    .filter_map(|kv| u64::try_from(kv.create_revision).ok())
                    .min();
                holders.push(holder);
            }
        }
        Ok(holders)
    }
}

impl LockSource for EtcdLocks {
    fn follow(self: Arc<Self>, feed: Feed) -> BoxFuture<'static, ()> {
        Box::pin(async move { follow_sessions(&feed, || self.session(&feed)).await })
    }

    fn holders<'a>(
        &'a self,
        locks: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Option<u64>>, String>> {
        Box::pin(self.read_holders(locks))
    }
}

/// The contenders of every lock, and so each lock's holder.
#[derive(Default)]
struct Contenders {
    /// Stored key → its lock and create revision.
    keys: HashMap<String, (String, u64)>,
    /// Lock → its resource and its contenders by create revision.
    locks: HashMap<String, (String, BTreeSet<(u64, String)>)>,
    /// Keys under the prefix that are no lock's (counted for the probe).
    others: BTreeSet<String>,
}

impl Contenders {
    /// Records a put of `key`; answers its lock when that lock's contenders changed.
    fn put(&mut self, mapping: &LockMapping, key: &str, create_revision: i64) -> Option<String> {
        let Some((lock, resource)) = mapping.lock_of_key(key) else {
            self.others.insert(key.to_owned());
            return None;
        };
        let revision = u64::try_from(create_revision).ok()?;
        if self.keys.get(key).is_some_and(|(_, r)| *r == revision) {
            // An update of a contender's value: nothing changes.
            return None;
        }
        if let Some((old_lock, old_revision)) = self.keys.remove(key) {
            self.remove_contender(&old_lock, old_revision, key);
        }
        self.keys.insert(key.to_owned(), (lock.clone(), revision));
        self.locks
            .entry(lock.clone())
            .or_insert_with(|| (resource, BTreeSet::new()))
            .1
            .insert((revision, key.to_owned()));
        Some(lock)
    }

    /// Records a delete of `key` (its lease ended, or it was released).
    fn delete(&mut self, key: &str) -> Option<String> {
        self.others.remove(key);
        let (lock, revision) = self.keys.remove(key)?;
        self.remove_contender(&lock, revision, key);
        Some(lock)
    }

    fn remove_contender(&mut self, lock: &str, revision: u64, key: &str) {
        if let Some((_, contenders)) = self.locks.get_mut(lock) {
            contenders.remove(&(revision, key.to_owned()));
        }
    }

    /// `lock`'s resource and holder now; forgets a lock left with no contenders.
    fn holder_of(&mut self, lock: &str) -> Option<(String, Option<Holder>)> {
        let (resource, contenders) = self.locks.get(lock)?;
        let resource = resource.clone();
        let holder = contenders.first().map(|(token, _)| Holder {
            lock: lock.to_owned(),
            token: *token,
        });
        if holder.is_none() {
            self.locks.remove(lock);
        }
        Some((resource, holder))
    }

    /// Every held lock's resource and holder.
    fn holders(&self) -> HashMap<String, Holder> {
        self.locks
            .iter()
            .filter_map(|(lock, (resource, contenders))| {
                let (token, _) = contenders.first()?;
                Some((
                    resource.clone(),
                    Holder {
                        lock: lock.clone(),
                        token: *token,
                    },
                ))
            })
            .collect()
    }

    fn stored_keys(&self) -> usize {
        self.keys.len() + self.others.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_create_revision_holds_and_its_delete_passes_the_lock_on() {
        let mapping = LockMapping::parse("locks/{id}", "r:{id}").expect("mapping");
        let mut c = Contenders::default();
        assert_eq!(
            c.put(&mapping, "locks/7/aa", 10).as_deref(),
            Some("locks/7")
        );
        assert_eq!(
            c.put(&mapping, "locks/7/bb", 12).as_deref(),
            Some("locks/7")
        );
        assert_eq!(c.put(&mapping, "locks/7/aa", 10), None, "a value update");
        assert_eq!(c.put(&mapping, "elsewhere/x", 13), None);
        assert_eq!(c.stored_keys(), 3);
        let holder =
            |c: &mut Contenders| c.holder_of("locks/7").and_then(|(_, h)| h).map(|h| h.token);
        assert_eq!(holder(&mut c), Some(10));
        assert_eq!(c.delete("locks/7/aa").as_deref(), Some("locks/7"));
        assert_eq!(holder(&mut c), Some(12));
        c.delete("locks/7/bb");
        assert_eq!(
            c.holder_of("locks/7"),
            Some(("r:7".to_owned(), None)),
            "free: reported once"
        );
        assert_eq!(c.holder_of("locks/7"), None);
        assert!(c.holders().is_empty());
    }
}
