//! Grants and ended leases on their way to the store: each raises its resource's mark, the
//! grant to the new holder's token, the end past the ended holder's, retried until it holds.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture};
use tokio::sync::mpsc;

use super::shared::Shared;
use super::view::Change;
use crate::config::Compare;

/// Raises a resource's mark to at least a value: how the authority reaches the fence store.
pub trait MarkRaiser: Send + Sync + 'static {
    fn raise<'a>(&'a self, resource: &'a str, mark: u64) -> BoxFuture<'a, Result<(), String>>;
}

/// Most raises sent together.
const RAISES_AT_ONCE: usize = 256;
/// Pause before raises that failed are tried again.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The mark that refuses every token below `token` and lets `token` pass, under `compare`.
pub(crate) fn mark_admitting(token: u64, compare: Compare) -> u64 {
    match compare {
        Compare::Monotonic => token,
        Compare::Strict => token.saturating_sub(1),
    }
}

/// What `change` raises its resource's mark to.
fn mark_for(change: &Change, compare: Compare) -> (String, u64, Option<u64>) {
    match change {
        Change::Granted { resource, token } => {
            (resource.clone(), mark_admitting(*token, compare), None)
        }
        Change::Ended { resource, token } => (
            resource.clone(),
            mark_admitting(token.saturating_add(1), compare),
            Some(*token),
        ),
    }
}

/// Runs until the feed's sender is dropped: collects changes, raises marks, retries failures.
pub(crate) async fn raise_marks(
    mut changes: mpsc::UnboundedReceiver<Change>,
    marks: Arc<dyn MarkRaiser>,
    shared: Arc<Shared>,
    compare: Compare,
) {
    // Per resource: the mark to raise to, and the highest ended token it fences.
    let mut pending: HashMap<String, (u64, Option<u64>)> = HashMap::new();
    loop {
        if pending.is_empty() {
            let Some(change) = changes.recv().await else {
                return;
            };
            add(&mut pending, &change, compare);
        }
        while let Ok(change) = changes.try_recv() {
            add(&mut pending, &change, compare);
        }
        let batch: Vec<(String, u64, Option<u64>)> = pending
            .iter()
            .take(RAISES_AT_ONCE)
            .map(|(resource, (mark, ended))| (resource.clone(), *mark, *ended))
            .collect();
        let outcomes = join_all(
            batch
                .iter()
                .map(|(resource, mark, _)| marks.raise(resource, *mark)),
        )
        .await;
        let mut failed = false;
        for ((resource, mark, ended), outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                Ok(()) => {
                    // Only if nothing newer for the resource arrived meanwhile.
                    if pending.get(&resource).is_some_and(|(m, _)| *m == mark) {
                        pending.remove(&resource);
                    }
                    if let Some(token) = ended {
                        shared
                            .view
                            .write()
                            .unwrap_or_else(PoisonError::into_inner)
                            .fenced(&resource, token);
                    }
                }
                Err(error) => {
                    failed = true;
                    tracing::warn!(%error, mark, "lock authority: raising a mark failed; will retry");
                }
            }
        }
        if failed {
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }
}

fn add(pending: &mut HashMap<String, (u64, Option<u64>)>, change: &Change, compare: Compare) {
    let (resource, mark, ended) = mark_for(change, compare);
    let entry = pending.entry(resource).or_insert((0, None));
    entry.0 = entry.0.max(mark);
    entry.1 = entry.1.max(ended);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_admit_the_holder_and_ends_refuse_the_ended_holder() {
        let grant = Change::Granted {
            resource: "r".to_owned(),
            token: 10,
        };
        let end = Change::Ended {
            resource: "r".to_owned(),
            token: 10,
        };
        // Monotonic: token >= mark passes.
        assert_eq!(mark_for(&grant, Compare::Monotonic).1, 10);
        assert_eq!(mark_for(&end, Compare::Monotonic).1, 11);
        // Strict: token > mark passes.
        assert_eq!(mark_for(&grant, Compare::Strict).1, 9);
        assert_eq!(mark_for(&end, Compare::Strict).1, 10);
    }
}
