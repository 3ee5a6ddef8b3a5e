//! The `FenceStore` contract, written once over `dyn FenceStore` so every backend runs the same
//! checks: comparison rules, racing advances on one key, many keys, the full u64 range, the
//! identity record, and marks that survive reopening.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use fencegate::config::Compare;
use fencegate::store::{Advance, FenceStore, StoreError};
use rand::Rng as _;

/// Runs the whole contract. `open` opens the backend under test on the same data every time it is
/// called (the suite calls it twice, to check that marks survive reconnecting).
pub async fn keeps_the_contract<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn FenceStore>>,
{
    let store = open().await;
    let identity = store.identity().await.expect("identity");
    assert!(identity.created, "a new store has no identity yet");
    monotonic_and_strict_comparisons(store.as_ref()).await;
    the_whole_u64_range_orders_correctly(store.as_ref()).await;
    racing_advances_on_one_key(Arc::clone(&store)).await;
    many_keys_are_independent(store.as_ref()).await;
    let race = store.current("race").await.unwrap();
    let again = store.identity().await.unwrap();
    assert_eq!(
        (again.id.as_str(), again.created),
        (identity.id.as_str(), false)
    );
    store.close().await.unwrap();
    assert!(
        store.advance("cmp", 9, Compare::Monotonic).await.is_err(),
        "a closed store refuses work"
    );

    // Reopened (reconnected), the marks and the identity are all there.
    let reopened = open().await;
    assert_eq!(reopened.current("cmp").await.unwrap(), Some(6));
    assert_eq!(reopened.current("range").await.unwrap(), Some(u64::MAX));
    assert_eq!(reopened.current("race").await.unwrap(), race);
    assert_eq!(reopened.current("many:499").await.unwrap(), Some(499));
    assert_eq!(reopened.identity().await.unwrap().id, identity.id);
    assert_eq!(
        reopened
            .advance("cmp", 5, Compare::Monotonic)
            .await
            .unwrap(),
        Advance::Stale { current: 6 }
    );
    reopened.close().await.unwrap();
}

async fn monotonic_and_strict_comparisons(store: &dyn FenceStore) {
    assert_eq!(store.current("cmp").await.unwrap(), None);
    assert_eq!(
        store.advance("cmp", 5, Compare::Monotonic).await.unwrap(),
        Advance::Accepted { previous: None }
    );
    assert_eq!(
        store.advance("cmp", 5, Compare::Monotonic).await.unwrap(),
        Advance::Accepted { previous: Some(5) }
    );
    assert_eq!(
        store.advance("cmp", 5, Compare::Strict).await.unwrap(),
        Advance::Stale { current: 5 }
    );
    assert_eq!(
        store.advance("cmp", 4, Compare::Monotonic).await.unwrap(),
        Advance::Stale { current: 5 }
    );
    assert_eq!(
        store.advance("cmp", 6, Compare::Strict).await.unwrap(),
        Advance::Accepted { previous: Some(5) }
    );
    assert_eq!(store.current("cmp").await.unwrap(), Some(6));
    // Zero is a token like any other.
    assert_eq!(
        store.advance("zero", 0, Compare::Monotonic).await.unwrap(),
        Advance::Accepted { previous: None }
    );
    assert_eq!(
        store.advance("zero", 0, Compare::Strict).await.unwrap(),
        Advance::Stale { current: 0 }
    );
}

async fn the_whole_u64_range_orders_correctly(store: &dyn FenceStore) {
    let high = 1u64 << 63;
    assert!(matches!(
        store
            .advance("range", high - 1, Compare::Strict)
            .await
            .unwrap(),
        Advance::Accepted { .. }
    ));
    assert!(matches!(
        store
            .advance("range", high + 5, Compare::Strict)
            .await
            .unwrap(),
        Advance::Accepted { .. }
    ));
    assert_eq!(
        store
            .advance("range", high + 4, Compare::Monotonic)
            .await
            .unwrap(),
        Advance::Stale { current: high + 5 }
    );
    assert_eq!(
        store.advance("range", 7, Compare::Monotonic).await.unwrap(),
        Advance::Stale { current: high + 5 }
    );
    assert!(matches!(
        store
            .advance("range", u64::MAX, Compare::Strict)
            .await
            .unwrap(),
        Advance::Accepted { .. }
    ));
    assert_eq!(store.current("range").await.unwrap(), Some(u64::MAX));
}

/// 64 tasks race to advance one key with random tokens. The final mark is the largest accepted
/// token, and no token was accepted after a larger one had been accepted (and its call had
/// returned) before the smaller call started.
async fn racing_advances_on_one_key(store: Arc<dyn FenceStore>) {
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut history = Vec::new();
                for _ in 0..20 {
                    let token = rand::thread_rng().gen_range(0..1_000u64);
                    let started = Instant::now();
                    let outcome = store
                        .advance("race", token, Compare::Monotonic)
                        .await
                        .unwrap();
                    history.push((token, started, Instant::now(), outcome));
                }
                history
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let accepted: Vec<_> = all
        .iter()
        .filter(|h| matches!(h.3, Advance::Accepted { .. }))
        .collect();
    let largest = accepted.iter().map(|h| h.0).max();
    assert_eq!(store.current("race").await.unwrap(), largest);
    for (token, started, _, _) in &accepted {
        let earlier_larger = accepted
            .iter()
            .find(|(t, _, ended, _)| t > token && ended < started);
        assert!(
            earlier_larger.is_none(),
            "token {token} accepted after {earlier_larger:?} had been"
        );
    }
    for (token, _, _, outcome) in &all {
        if let Advance::Stale { current } = outcome {
            assert!(
                current > token,
                "stale {token} reported a mark {current} not above it"
            );
        }
    }
}

async fn many_keys_are_independent(store: &dyn FenceStore) {
    let writes = (0..500u64).map(|key| async move {
        store
            .advance(&format!("many:{key}"), key, Compare::Strict)
            .await
            .unwrap()
    });
    let outcomes = futures_util::future::join_all(writes).await;
    assert!(outcomes
        .iter()
        .all(|o| *o == Advance::Accepted { previous: None }));
    for key in 0..500u64 {
        assert_eq!(
            store.current(&format!("many:{key}")).await.unwrap(),
            Some(key)
        );
    }
}

/// `tasks` tasks (spread over the runtime's threads) advance `key` under `strict` with
/// interleaved tokens 1..=tasks×rounds. Every accepted advance names the mark it replaced; each
/// mark must be replaced at most once and always by a larger token, so the accepted tokens form
/// one increasing chain (I1), ending at the highest token, which is the key's mark afterwards.
pub async fn advances_from_many_tasks_form_one_chain(
    store: Arc<dyn FenceStore>,
    key: &'static str,
    tasks: u64,
    rounds: u64,
) {
    let mut running = Vec::new();
    for task in 0..tasks {
        let store = Arc::clone(&store);
        running.push(tokio::spawn(async move {
            let mut accepted = Vec::new();
            for round in 0..rounds {
                let token = round * tasks + task + 1;
                if let Ok(Advance::Accepted { previous }) =
                    store.advance(key, token, Compare::Strict).await
                {
                    accepted.push((previous, token));
                }
                if round % 16 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            accepted
        }));
    }
    let mut accepted = Vec::new();
    for task in running {
        accepted.extend(task.await.expect("advancing task"));
    }
    let mut replaced = std::collections::HashMap::new();
    for (previous, token) in &accepted {
        if let Some(previous) = previous {
            assert!(token > previous, "{token} accepted over {previous}");
        }
        assert!(
            replaced.insert(*previous, *token).is_none(),
            "the mark {previous:?} was replaced twice"
        );
    }
    let highest = accepted.iter().map(|(_, t)| *t).max();
    assert_eq!(
        highest,
        Some(tasks * rounds),
        "the highest token is always accepted"
    );
    assert_eq!(store.current(key).await.ok(), Some(highest));
}

/// After `close`, advances and reads from tasks on every runtime thread are refused with
/// `Closed`: no thread starts a new writer or connection for a closed store.
pub async fn closed_store_refuses_on_every_thread(store: Arc<dyn FenceStore>, key: &'static str) {
    store.close().await.expect("close");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let advanced = store.advance(key, u64::MAX, Compare::Strict).await;
            assert!(matches!(advanced, Err(StoreError::Closed)), "{advanced:?}");
            let read = store.current(key).await;
            assert!(matches!(read, Err(StoreError::Closed)), "{read:?}");
        }));
    }
    for task in tasks {
        task.await.expect("task after close");
    }
}

/// Values where comparing as doubles, or as unpadded strings, would go wrong.
pub const TRICKY: [u64; 14] = [
    0,
    1,
    9,
    10,
    99,
    100,
    (1 << 53) - 1,
    1 << 53,
    (1 << 53) + 1,
    (1 << 63) - 1,
    1 << 63,
    (1 << 63) + 1,
    u64::MAX - 1,
    u64::MAX,
];
