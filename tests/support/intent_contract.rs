//! The `IntentStore` contract, written once over `dyn IntentStore` so every backend runs the same
//! checks: the begin rule, completion and abandonment, listing for reconciliation, operator
//! resolution, retention pruning, and concurrent duplicates (exactly one attempt wins); and,
//! over both traits of one backend, an advance and a begin in one round.

use std::sync::Arc;

use fencegate::config::Compare;
use fencegate::store::{
    Advance, AdvanceAndBegin, BeginRequest, Begun, FenceStore, IntentState, IntentStore,
    Resolution, StoredOutcome,
};

const DAY_MS: u64 = 86_400_000;

fn request(key: &str, fence: u64, fingerprint: &str, now_ms: u64) -> BeginRequest {
    BeginRequest {
        key: key.to_owned(),
        route: "payouts".to_owned(),
        fence,
        fingerprint: fingerprint.to_owned(),
        attempt: uuid::Uuid::new_v4().to_string(),
        attempt_expires_ms: now_ms + 1_000,
        now_ms,
        expires_ms: now_ms + DAY_MS,
    }
}

fn outcome(status: u16, body: &[u8]) -> StoredOutcome {
    StoredOutcome {
        status,
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        body: bytes::Bytes::copy_from_slice(body),
        body_complete: true,
    }
}

/// Runs the whole contract against `store` (which must hold no intents of these keys yet).
pub async fn keeps_the_intent_contract(store: Arc<dyn IntentStore>) {
    census_counts_what_is_submitting(store.as_ref()).await;
    begin_complete_and_replay(store.as_ref()).await;
    abandoned_attempts_can_be_resubmitted(store.as_ref()).await;
    reconciliation_lists_and_resolves(store.as_ref()).await;
    retention_prunes_in_bounded_batches(store.as_ref()).await;
    concurrent_duplicates_start_one_attempt(store).await;
}

/// The census behind `fencegate_intents{state}`: it counts SUBMITTING intents, abandoned ones
/// included, and finds the oldest's last update; completed ones are counted apart, released ones
/// not at all.
async fn census_counts_what_is_submitting(store: &dyn IntentStore) {
    let before = store.census().await.unwrap();
    let t = 100_000;
    let first = request("n:1", 1, "fp", t);
    let second = request("n:2", 1, "fp", t + 200);
    let third = request("n:3", 1, "fp", t + 400);
    for attempt in [&first, &second, &third] {
        assert_eq!(store.begin(attempt.clone()).await.unwrap(), Begun::Fresh);
    }
    store
        .abandon("n:2", &second.attempt, t + 300)
        .await
        .unwrap();
    let census = store.census().await.unwrap();
    assert_eq!(census.submitting, before.submitting + 3);
    assert_eq!(census.completed, before.completed);
    if before.submitting == 0 {
        assert_eq!(
            census.oldest_submitting_ms,
            Some(t),
            "the oldest last update"
        );
    }
    assert!(store
        .complete("n:1", outcome(200, b"{}"), t + 500)
        .await
        .unwrap());
    assert!(store
        .resolve("n:3", Resolution::Release, t + 500)
        .await
        .unwrap());
    let census = store.census().await.unwrap();
    assert_eq!(
        census.submitting,
        before.submitting + 1,
        "completed and released intents are not counted"
    );
    assert_eq!(census.completed, before.completed + 1, "n:1 completed");
    if before.submitting == 0 {
        assert_eq!(
            census.oldest_submitting_ms,
            Some(t + 300),
            "n:2, last abandoned"
        );
    }
    assert!(store
        .resolve("n:2", Resolution::Release, t + 600)
        .await
        .unwrap());
    let census = store.census().await.unwrap();
    assert_eq!(
        (
            census.submitting,
            census.oldest_submitting_ms,
            census.completed
        ),
        (
            before.submitting,
            before.oldest_submitting_ms,
            before.completed + 1
        )
    );
}

async fn begin_complete_and_replay(store: &dyn IntentStore) {
    let t = 1_000_000;
    let first = request("c:1", 5, "fp", t);
    assert_eq!(store.begin(first.clone()).await.unwrap(), Begun::Fresh);
    let record = store
        .get("c:1")
        .await
        .unwrap()
        .expect("recorded before the call");
    assert_eq!(record.state, IntentState::Submitting);
    assert_eq!(
        (
            record.fence,
            record.fingerprint.as_str(),
            record.route.as_str()
        ),
        (5, "fp", "payouts")
    );
    assert_eq!(record.attempt.as_deref(), Some(first.attempt.as_str()));
    assert!(matches!(
        store.begin(request("c:1", 5, "fp", t + 10)).await.unwrap(),
        Begun::InFlight {
            retry_after_ms: 990
        }
    ));
    assert_eq!(
        store
            .begin(request("c:1", 5, "other", t + 10))
            .await
            .unwrap(),
        Begun::Mismatch
    );

    let answer = outcome(201, &[0, 1, 2, 255]);
    assert!(store.complete("c:1", answer.clone(), t + 20).await.unwrap());
    assert!(
        !store
            .complete("c:1", outcome(500, b""), t + 21)
            .await
            .unwrap(),
        "an outcome is recorded once"
    );
    assert_eq!(
        store.begin(request("c:1", 5, "fp", t + 30)).await.unwrap(),
        Begun::Completed(answer.clone())
    );
    assert_eq!(
        store.begin(request("c:1", 9, "fp", t + 30)).await.unwrap(),
        Begun::Completed(answer)
    );
    let done = store.get("c:1").await.unwrap().unwrap();
    assert_eq!((done.state, done.attempt), (IntentState::Completed, None));
    assert_eq!(store.get("c:none").await.unwrap(), None);
}

async fn abandoned_attempts_can_be_resubmitted(store: &dyn IntentStore) {
    let t = 2_000_000;
    let first = request("a:1", 5, "fp", t);
    assert_eq!(store.begin(first.clone()).await.unwrap(), Begun::Fresh);
    store.abandon("a:1", &first.attempt, t + 5).await.unwrap();
    let record = store.get("a:1").await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.attempt),
        (IntentState::Submitting, None)
    );
    assert_eq!(
        store.begin(request("a:1", 4, "fp", t + 10)).await.unwrap(),
        Begun::Superseded { fence: 5 }
    );
    assert_eq!(
        store.begin(request("a:1", 6, "fp", t + 10)).await.unwrap(),
        Begun::Resubmit { previous_fence: 5 }
    );
    assert_eq!(store.get("a:1").await.unwrap().unwrap().fence, 6);
    // Abandoning someone else's attempt changes nothing.
    store.abandon("a:1", "not-mine", t + 11).await.unwrap();
    assert!(store.get("a:1").await.unwrap().unwrap().attempt.is_some());
    // An attempt whose lease ran out (its gateway died) does not block the next one.
    assert!(matches!(
        store
            .begin(request("a:1", 6, "fp", t + 5_000))
            .await
            .unwrap(),
        Begun::Resubmit { .. }
    ));
}

async fn reconciliation_lists_and_resolves(store: &dyn IntentStore) {
    let t = 3_000_000;
    for (n, key) in ["r:1", "r:2", "r:3"].iter().enumerate() {
        let attempt = request(key, 1, "fp", t + n as u64 * 100);
        assert_eq!(store.begin(attempt.clone()).await.unwrap(), Begun::Fresh);
        store
            .abandon(key, &attempt.attempt, t + n as u64 * 100)
            .await
            .unwrap();
    }
    let stuck = store.list_submitting(t + 150, 100).await.unwrap();
    let keys: Vec<&str> = stuck
        .iter()
        .map(|r| r.key.as_str())
        .filter(|k| k.starts_with("r:"))
        .collect();
    assert_eq!(
        keys,
        ["r:1", "r:2"],
        "oldest first, only those older than asked"
    );
    assert!(
        store.list_submitting(t + 1_000, 1).await.unwrap().len() <= 1,
        "the limit holds"
    );

    let paid = outcome(200, b"{\"charged\":true}");
    assert!(store
        .resolve("r:1", Resolution::Outcome(paid.clone()), t + 500)
        .await
        .unwrap());
    assert_eq!(
        store.begin(request("r:1", 1, "fp", t + 600)).await.unwrap(),
        Begun::Completed(paid)
    );
    assert!(store
        .resolve("r:2", Resolution::Release, t + 500)
        .await
        .unwrap());
    assert_eq!(store.get("r:2").await.unwrap(), None);
    assert_eq!(
        store.begin(request("r:2", 1, "fp", t + 600)).await.unwrap(),
        Begun::Fresh
    );
    assert!(!store
        .resolve("r:missing", Resolution::Release, t)
        .await
        .unwrap());
    let listed: Vec<String> = store
        .list_submitting(t + 10_000, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert!(
        !listed.contains(&"r:1".to_owned()),
        "a resolved intent is not listed"
    );
}

async fn retention_prunes_in_bounded_batches(store: &dyn IntentStore) {
    let t = 4_000_000;
    for n in 0..5 {
        let mut short = request(&format!("p:{n}"), 1, "fp", t);
        short.expires_ms = t + 10;
        assert_eq!(store.begin(short).await.unwrap(), Begun::Fresh);
    }
    // Every earlier record of this suite expires a day after it was made: far beyond `t + 20`.
    assert_eq!(store.prune(t + 20, 3).await.unwrap(), 3);
    assert_eq!(store.prune(t + 20, 100).await.unwrap(), 2);
    assert_eq!(store.prune(t + 20, 100).await.unwrap(), 0);
    assert_eq!(store.get("p:0").await.unwrap(), None);
    assert!(
        store.get("c:1").await.unwrap().is_some(),
        "records within retention stay"
    );
}

async fn concurrent_duplicates_start_one_attempt(store: Arc<dyn IntentStore>) {
    let t = 5_000_000;
    let attempts = (0..32).map(|_| {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.begin(request("d:1", 7, "fp", t)).await.unwrap() })
    });
    // Spawn them all before awaiting any: a lazy iterator would run them one after another.
    let attempts: Vec<_> = attempts.collect();
    let mut fresh = 0;
    for attempt in attempts {
        match attempt.await.unwrap() {
            Begun::Fresh => fresh += 1,
            Begun::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one duplicate may call the provider");
}

/// `AdvanceAndBegin::advance_and_begin` on a backend that has the round, seen through all three
/// traits: an accepted token leaves its advance durable and begins the intent by the rule of a
/// separate `begin`, and a stale token begins nothing.
pub async fn advance_and_begin_agrees_with_separate_calls(
    combined: &dyn AdvanceAndBegin,
    fences: &dyn FenceStore,
    intents: &dyn IntentStore,
) {
    let t = 3_000_000;
    let first = request("ab:1", 7, "fp", t);
    let answer = combined
        .advance_and_begin("ab-key:1", 7, Compare::Monotonic, first)
        .await
        .unwrap();
    assert_eq!(answer.advance, Advance::Accepted { previous: None });
    assert_eq!(answer.begun.expect("begun").unwrap(), Begun::Fresh);
    assert_eq!(fences.current("ab-key:1").await.unwrap(), Some(7));
    let record = intents.get("ab:1").await.unwrap().expect("recorded");
    assert_eq!((record.state, record.fence), (IntentState::Submitting, 7));

    // A stale token: refused, and no intent begun.
    let stale = request("ab:2", 6, "fp", t);
    let answer = combined
        .advance_and_begin("ab-key:1", 6, Compare::Monotonic, stale)
        .await
        .unwrap();
    assert_eq!(answer.advance, Advance::Stale { current: 7 });
    assert!(answer.begun.is_none());
    assert_eq!(intents.get("ab:2").await.unwrap(), None);

    // The same token again (monotonic): accepted, and the begin answers as `begin` would.
    let repeat = request("ab:1", 7, "fp", t + 1);
    let answer = combined
        .advance_and_begin("ab-key:1", 7, Compare::Monotonic, repeat)
        .await
        .unwrap();
    assert_eq!(answer.advance, Advance::Accepted { previous: Some(7) });
    assert!(matches!(
        answer.begun.expect("begun").unwrap(),
        Begun::InFlight { .. }
    ));
}
