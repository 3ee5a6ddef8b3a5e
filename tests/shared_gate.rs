//! The cross-replica gate on PostgreSQL (`PostgresGate`), driven directly: two gates with pools of
//! their own stand for two replicas. A held key keeps the other replica out until it is released;
//! a wait that is abandoned half-way (the request went away) leaves no lock behind in the pool;
//! keys entered together (batched on the lock-holder sessions) are all held and all released; an
//! entry abandoned before its batch answered leaves no lock behind on the holder session; releases
//! and entries queued together both take effect; a batched entry comes with the key's mark, read
//! after the lock was taken; an entry with a token advances the key's mark in the statement that
//! takes its lock, and only when it takes it; a key entered again from another thread before its
//! release ran goes to the lock-holder session that still holds it.
//! PostgreSQL must be running on 127.0.0.1:5432: these tests fail, never skip, when it is not.

mod support;

use std::sync::Arc;
use std::time::Duration;

use fencegate::config::{
    Compare, PostgresStoreConfig, DEFAULT_CACHE_CAPACITY, DEFAULT_MAX_BATCH,
    DEFAULT_POSTGRES_BATCHES_IN_FLIGHT,
};
use fencegate::gate::{PostgresGate, SharedGateError, SharedPass};
use fencegate::store::{migrate_postgres, Advance, FenceStore, PostgresStore};
use futures_util::FutureExt as _;
use support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};

/// A gate whose pool has `connections` connections, on schema `namespace` (migrated first, as the
/// gateway's store does before the gate opens; it also namespaces the lock ids).
async fn gate(namespace: &str, connections: u32) -> PostgresGate {
    let config = config(namespace, connections);
    migrate_postgres(&config)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {TEST_POSTGRES_URL} is required: {e}"));
    PostgresGate::open(&config)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {TEST_POSTGRES_URL} is required: {e}"))
}

fn config(namespace: &str, connections: u32) -> PostgresStoreConfig {
    PostgresStoreConfig {
        url: TEST_POSTGRES_URL.to_owned(),
        schema: namespace.to_owned(),
        max_connections: 2,
        batches_in_flight: DEFAULT_POSTGRES_BATCHES_IN_FLIGHT,
        gate_connections: connections,
        max_batch: DEFAULT_MAX_BATCH,
        cache_capacity: DEFAULT_CACHE_CAPACITY,
    }
}

/// Enters `key` on `gate`, retrying briefly: a released lock is unlocked in the background.
async fn enter_soon(gate: &PostgresGate, key: &str) -> SharedPass {
    for _ in 0..50 {
        match gate.enter(key, Duration::from_millis(100)).await {
            Ok(pass) => return pass,
            Err(SharedGateError::Timeout(_)) => continue,
            Err(e) => panic!("entering the gate failed: {e}"),
        }
    }
    panic!("the gate of {key} never opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_keeps_the_other_replica_out_until_released() {
    let namespace = unique_schema();
    let (one, two) = (gate(&namespace, 2).await, gate(&namespace, 2).await);
    let held = one
        .enter("invoice:1", Duration::from_secs(2))
        .await
        .expect("first entry");
    match two.enter("invoice:1", Duration::from_millis(200)).await {
        Err(SharedGateError::Timeout(_)) => {}
        Err(e) => panic!("expected a timeout, got {e}"),
        Ok(_) => panic!("the other replica entered a held key"),
    }
    // Another key is not held up.
    drop(
        two.enter("invoice:2", Duration::from_millis(500))
            .await
            .expect("another key"),
    );
    drop(held);
    drop(enter_soon(&two, "invoice:1").await);
    one.close().await;
    two.close().await;
    drop_schema(&namespace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_wait_leaves_no_lock_behind() {
    let namespace = unique_schema();
    let holder = gate(&namespace, 1).await;
    // One connection, so a leaked lock would sit on the very connection the next entry gets.
    let waiter = gate(&namespace, 1).await;
    let held = holder
        .enter("invoice:7", Duration::from_secs(2))
        .await
        .expect("first entry");
    // The waiter's statement is waiting on the server when its future is dropped.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        waiter.enter("invoice:7", Duration::from_secs(5)),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the wait should still have been pending"
    );
    // The holder releases; the abandoned statement may now take the lock on the server, on a
    // connection that was closed rather than pooled, so the lock dies with its session.
    drop(held);
    drop(enter_soon(&waiter, "invoice:7").await);
    drop(enter_soon(&holder, "invoice:7").await);
    holder.close().await;
    waiter.close().await;
    drop_schema(&namespace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_entered_together_are_all_held_and_all_released() {
    let namespace = unique_schema();
    let (one, two) = (
        Arc::new(gate(&namespace, 2).await),
        Arc::new(gate(&namespace, 2).await),
    );
    // 200 entries at once: they go to the lock-holder sessions in a few batches.
    let entries: Vec<_> = (0..200)
        .map(|i| {
            let one = Arc::clone(&one);
            tokio::spawn(async move {
                one.enter(&format!("invoice:{i}"), Duration::from_secs(5))
                    .await
                    .unwrap_or_else(|e| panic!("entry {i}: {e}"))
            })
        })
        .collect();
    let mut passes = Vec::new();
    for entry in entries {
        passes.push(entry.await.expect("entry task"));
    }
    for i in [0, 77, 199] {
        match two
            .enter(&format!("invoice:{i}"), Duration::from_millis(100))
            .await
        {
            Err(SharedGateError::Timeout(_)) => {}
            Err(e) => panic!("expected a timeout, got {e}"),
            Ok(_) => panic!("the other replica entered held key {i}"),
        }
    }
    drop(passes);
    for i in [0, 77, 199] {
        drop(enter_soon(&two, &format!("invoice:{i}")).await);
    }
    one.close().await;
    two.close().await;
    drop_schema(&namespace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_abandoned_before_its_batch_answered_leaves_no_lock_behind() {
    let namespace = unique_schema();
    let (one, two) = (gate(&namespace, 1).await, gate(&namespace, 1).await);
    // Polled once (the entry is queued for the lock-holder session), then dropped: if the
    // session takes the lock, nobody is left to hold it, and it must be released.
    for _ in 0..20 {
        let abandoned = one
            .enter("invoice:9", Duration::from_secs(5))
            .now_or_never();
        assert!(
            abandoned.is_none(),
            "the entry should not have answered at its first poll"
        );
    }
    drop(enter_soon(&two, "invoice:9").await);
    one.close().await;
    two.close().await;
    drop_schema(&namespace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_entry_comes_with_the_mark_read_after_the_lock() {
    let namespace = unique_schema();
    let gate = gate(&namespace, 2).await;
    let store = PostgresStore::open(&config(&namespace, 2))
        .await
        .expect("store on the same schema");
    assert_eq!(
        store
            .advance("invoice:7", u64::MAX - 3, Compare::Strict)
            .await
            .ok(),
        Some(Advance::Accepted { previous: None })
    );
    let pass = gate
        .enter("invoice:7", Duration::from_secs(2))
        .await
        .expect("entry");
    assert_eq!(pass.mark_under_lock(), Some(Some(u64::MAX - 3)));
    // An advance made while the first pass is held is seen by the next entry of the key.
    assert!(matches!(
        store.advance("invoice:7", u64::MAX, Compare::Strict).await,
        Ok(Advance::Accepted { .. })
    ));
    drop(pass);
    let again = enter_soon(&gate, "invoice:7").await;
    assert_eq!(again.mark_under_lock(), Some(Some(u64::MAX)));
    drop(again);
    let fresh = gate
        .enter("invoice:never", Duration::from_secs(2))
        .await
        .expect("entry");
    assert_eq!(fresh.mark_under_lock(), Some(None));
    drop(fresh);
    store.close().await.expect("close");
    gate.close().await;
    drop_schema(&namespace).await;
}

/// Takes `key` with an advance to `token` on `gate`, retrying briefly while a released lock of
/// the key is still being unlocked in the background.
async fn enter_and_advance_soon(
    gate: &PostgresGate,
    key: &str,
    token: u64,
) -> (SharedPass, Option<u64>) {
    for _ in 0..50 {
        match gate.try_enter_and_advance(key, token).await {
            Ok(Some(taken)) => return taken,
            Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("entering the gate failed: {e}"),
        }
    }
    panic!("the gate of {key} never opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_with_a_token_advances_the_mark_under_the_lock_and_only_there() {
    let namespace = unique_schema();
    let (one, two) = (gate(&namespace, 2).await, gate(&namespace, 2).await);
    let store = PostgresStore::open(&config(&namespace, 2))
        .await
        .expect("store on the same schema");
    let base = u64::MAX - 100;
    assert!(matches!(
        store.advance("invoice:8", base, Compare::Strict).await,
        Ok(Advance::Accepted { .. })
    ));
    // Taken: the advance replaced the stored mark, durably, in the statement that took the lock.
    let (pass, replaced) = enter_and_advance_soon(&one, "invoice:8", base + 5).await;
    assert_eq!(replaced, Some(base));
    assert_eq!(store.current("invoice:8").await.ok(), Some(Some(base + 5)));
    // Held by the other replica: not taken, and nothing is advanced.
    assert!(matches!(
        two.try_enter_and_advance("invoice:8", base + 10).await,
        Ok(None)
    ));
    assert_eq!(store.current("invoice:8").await.ok(), Some(Some(base + 5)));
    // Waited for on a dedicated connection instead: no advance either (the caller makes it).
    let waiting = two.wait_for("invoice:8", Duration::from_secs(5));
    drop(pass);
    let waited = waiting.await.expect("the lock, once released");
    assert_eq!(store.current("invoice:8").await.ok(), Some(Some(base + 5)));
    drop(waited);
    // A lower token never lowers the mark; the answer says what it met.
    let (lower, replaced) = enter_and_advance_soon(&one, "invoice:8", base + 1).await;
    assert_eq!(replaced, Some(base + 5));
    assert_eq!(store.current("invoice:8").await.ok(), Some(Some(base + 5)));
    drop(lower);
    // A key with no mark gets the token as its mark.
    let (fresh, replaced) = enter_and_advance_soon(&two, "invoice:fresh", 3).await;
    assert_eq!(replaced, None);
    assert_eq!(store.current("invoice:fresh").await.ok(), Some(Some(3)));
    // A lock-only entry (on the same replica: its lock session takes the key at once) is no
    // advance.
    drop(fresh);
    let plain = enter_soon(&two, "invoice:fresh").await;
    assert_eq!(plain.mark_under_lock(), Some(Some(3)));
    drop(plain);
    store.close().await.expect("close");
    one.close().await;
    two.close().await;
    drop_schema(&namespace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_entries_with_tokens_in_one_batch_each_advance_their_own_key() {
    let namespace = unique_schema();
    let gate = Arc::new(gate(&namespace, 2).await);
    let store = PostgresStore::open(&config(&namespace, 2))
        .await
        .expect("store on the same schema");
    let entries: Vec<_> = (0..200u64)
        .map(|i| {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move {
                let pass = gate
                    .try_enter_and_advance(&format!("batch:{i}"), 1000 + i)
                    .await
                    .unwrap_or_else(|e| panic!("batch:{i}: {e}"))
                    .unwrap_or_else(|| panic!("batch:{i} was not taken"));
                assert_eq!(pass.1, None, "batch:{i}");
                pass
            })
        })
        .collect();
    let mut held = Vec::new();
    for entry in entries {
        held.push(entry.await.expect("entry task"));
    }
    for i in 0..200u64 {
        assert_eq!(
            store.current(&format!("batch:{i}")).await.ok(),
            Some(Some(1000 + i))
        );
    }
    drop(held);
    store.close().await.expect("close");
    gate.close().await;
    drop_schema(&namespace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_and_entries_batched_together_both_take_effect() {
    releases_and_entries_batched_together(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_and_entries_with_tokens_batched_together_both_take_effect() {
    releases_and_entries_batched_together(true).await;
}

/// Holds 100 keys on one replica, then releases them while it enters 100 new ones, so that
/// releases and entries share statements (`with_tokens`: entries that advance, which go in the
/// plain statement; else lock-only ones, which go in the function). The other replica then finds
/// the old keys free (and, with tokens, advanced) and the new ones held.
async fn releases_and_entries_batched_together(with_tokens: bool) {
    let namespace = unique_schema();
    let (one, two) = (
        Arc::new(gate(&namespace, 2).await),
        Arc::new(gate(&namespace, 2).await),
    );
    let mut held = Vec::new();
    for i in 0..100 {
        held.push(enter_and_advance_soon(&one, &format!("old:{i}"), 1).await.0);
    }
    let entries: Vec<_> = (0..100)
        .map(|i| {
            let one = Arc::clone(&one);
            tokio::spawn(async move {
                let key = format!("new:{i}");
                if with_tokens {
                    one.try_enter_and_advance(&key, 2)
                        .await
                        .unwrap_or_else(|e| panic!("{key}: {e}"))
                        .unwrap_or_else(|| panic!("{key} was not taken"))
                        .0
                } else {
                    one.enter(&key, Duration::from_secs(5))
                        .await
                        .unwrap_or_else(|e| panic!("{key}: {e}"))
                }
            })
        })
        .collect();
    drop(held);
    let mut new = Vec::new();
    for entry in entries {
        new.push(entry.await.expect("entry task"));
    }
    for i in 0..100 {
        let (_pass, replaced) = enter_and_advance_soon(&two, &format!("old:{i}"), 3).await;
        assert_eq!(replaced, Some(1), "old:{i}");
    }
    for i in [0, 50, 99] {
        assert!(
            matches!(
                two.enter(&format!("new:{i}"), Duration::from_millis(50))
                    .await,
                Err(SharedGateError::Timeout(_))
            ),
            "new:{i} is held by the first replica"
        );
    }
    drop(new);
    one.close().await;
    two.close().await;
    drop_schema(&namespace).await;
}

/// A current-thread runtime of its own, as each serving thread has.
fn thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn a_key_entered_again_before_its_release_ran_goes_to_the_session_holding_it() {
    let setup = thread_runtime();
    let namespace = unique_schema();
    let gate = Arc::new(setup.block_on(gate(&namespace, 2)));
    let (released, release_queued) = std::sync::mpsc::channel();
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let gate = Arc::clone(&gate);
        std::thread::spawn(move || {
            thread_runtime().block_on(async move {
                let pass = gate
                    .try_enter_and_advance("k", 1)
                    .await
                    .expect("entry")
                    .expect("an open key is taken");
                // Queues the release on this thread's lock-holder session, which cannot run
                // while this thread sleeps.
                drop(pass);
                released.send(()).expect("second thread");
                std::thread::sleep(Duration::from_millis(300));
                // Now let the holder run until the second thread has its answer.
                let _ = finished.await;
            });
        })
    };
    release_queued.recv().expect("first thread");
    // Another thread's entry must go to the session that still holds the key: its own session
    // would find the key held and answer `None`.
    let second = thread_runtime().block_on(gate.try_enter_and_advance("k", 2));
    let pass = second.expect("entry");
    assert!(
        pass.as_ref().map(|(_, replaced)| *replaced) == Some(Some(1)),
        "the key was taken again, after its release, by the session holding it"
    );
    drop(pass);
    let _ = done.send(());
    first.join().expect("first thread");
    setup.block_on(async {
        gate.close().await;
        drop_schema(&namespace).await;
    });
}
