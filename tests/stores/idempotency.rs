//! Idempotency for a provider that cannot be fenced (docs/design.md §6), against every backend,
//! with a fake payment provider that honours the idempotency header or ignores it, and faults: it
//! charges then drops the connection, charges then answers 500, charges then answers too late.
//!
//! Asserted: one charge per payout when the provider honours the key; when it does not, never a
//! second charge once an outcome is known, and every unknown outcome listed for reconciliation;
//! 409 (in progress, superseded holder), 422 (reused key) and replay exactly as specified.

use std::time::Duration;

use fencegate::store::{IntentState, Resolution, StoredOutcome};

use crate::support;
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::provider::{Fault, Provider, KEY_HEADER};
use crate::support::{send, Reply, TestGateway};

/// The store under test and how to clean it up.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Embedded,
    Postgres,
    Redis,
    Etcd,
}

struct Setup {
    gw: TestGateway,
    provider: Provider,
    _dir: tempfile::TempDir,
    cleanup: Box<dyn FnOnce() -> futures_util::future::BoxFuture<'static, ()> + Send>,
}

impl Setup {
    async fn start(backend: Backend, honours_keys: bool, idempotency_extra: &str) -> Setup {
        Setup::start_with_store(backend, honours_keys, idempotency_extra, "").await
    }

    /// Like `start`, with `store_extra` appended to the `[store]` table.
    async fn start_with_store(
        backend: Backend,
        honours_keys: bool,
        idempotency_extra: &str,
        store_extra: &str,
    ) -> Setup {
        Setup::start_towards(backend, None, honours_keys, idempotency_extra, store_extra).await
    }

    /// Like `start_with_store`, with the route's upstream at `upstream` instead of the provider
    /// when one is given.
    async fn start_towards(
        backend: Backend,
        upstream: Option<String>,
        honours_keys: bool,
        idempotency_extra: &str,
        store_extra: &str,
    ) -> Setup {
        let provider = Provider::start(honours_keys).await;
        let upstream = upstream.unwrap_or_else(|| provider.url());
        let dir = tempfile::tempdir().unwrap();
        let (store, cleanup): (
            String,
            Box<dyn FnOnce() -> futures_util::future::BoxFuture<'static, ()> + Send>,
        ) = match backend {
            Backend::Embedded => (
                support::gateway::embedded_store(dir.path()),
                Box::new(|| Box::pin(async {})),
            ),
            Backend::Postgres => {
                let schema = unique_schema();
                let store = format!("[store]\nbackend = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\nschema = \"{schema}\"\n");
                (
                    store,
                    Box::new(move || Box::pin(async move { drop_schema(&schema).await })),
                )
            }
            Backend::Redis => {
                let prefix = support::redis::unique_prefix();
                let store = format!(
                    "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n",
                    support::redis::redis_url()
                );
                (
                    store,
                    Box::new(move || {
                        Box::pin(async move { support::redis::delete_keys(&prefix).await })
                    }),
                )
            }
            Backend::Etcd => {
                let prefix = support::etcd::unique_prefix();
                let store = format!(
                    "[store]\nbackend = \"etcd\"\nendpoints = [\"{}\"]\nkey_prefix = \"{prefix}\"\n",
                    support::etcd::etcd_url()
                );
                (
                    store,
                    Box::new(move || {
                        Box::pin(async move { support::etcd::delete_keys(&prefix).await })
                    }),
                )
            }
        };
        let store = format!("{store}{store_extra}\n");
        let routes = format!(
            "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"payout:{{id}}\"\ntimeout = \"500ms\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\n{idempotency_extra}\n"
        );
        let gw = TestGateway::builder(&routes)
            .in_dir(dir.path())
            .store_toml(&store)
            .start()
            .await;
        Setup {
            gw,
            provider,
            _dir: dir,
            cleanup,
        }
    }

    async fn pay(&self, id: u32, fence: u64, amount: u32) -> Reply {
        send(
            "POST",
            &self.gw.url(&format!("/payouts/{id}")),
            &[("x-fence", &fence.to_string())],
            &format!("{{\"amount\":{amount}}}"),
        )
        .await
    }

    /// The state and fence of payout `id`'s intent record, which must exist.
    async fn intent_of(&self, id: u32) -> (IntentState, u64) {
        let intent = self
            .gw
            .intents()
            .get(&format!("payouts/payout:{id}"))
            .await
            .unwrap()
            .expect("an intent record");
        (intent.state, intent.fence)
    }

    async fn submitting(&self) -> Vec<String> {
        let far_future = fencegate::idempotency::now_ms() + 3_600_000;
        let records = self
            .gw
            .intents()
            .list_submitting(far_future, 100)
            .await
            .unwrap();
        records.into_iter().map(|r| r.key).collect()
    }

    async fn finish(self) {
        self.gw.stop().await;
        (self.cleanup)().await;
    }
}

async fn retries_by_the_same_holder_are_replayed(backend: Backend) {
    for honours in [true, false] {
        let s = Setup::start(backend, honours, "").await;
        let first = s.pay(1, 5, 100).await;
        assert_eq!(first.status, 201);
        assert!(first.header("idempotent-replayed").is_none());
        let again = s.pay(1, 5, 100).await;
        assert_eq!(again.status, 201);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.body, first.body, "the stored answer is replayed");
        assert_eq!(again.header("content-type"), Some("application/json"));
        assert_eq!(
            (s.provider.calls(), s.provider.charges().len()),
            (1, 1),
            "honours={honours}"
        );
        assert_eq!(
            s.provider.charges()[0].key.as_deref(),
            Some("payout:1"),
            "the stable key was sent"
        );
        assert_eq!(s.provider.charges()[0].body.as_ref(), b"{\"amount\":100}");
        s.finish().await;
    }
}

async fn unknown_outcomes_are_listed_and_resubmitted_with_the_same_key(backend: Backend) {
    let faults = [
        (Fault::DropConnection, 502),
        (Fault::Answer500, 500),
        (Fault::AnswerLate(Duration::from_millis(1500)), 504),
    ];
    for honours in [true, false] {
        for (fault, status) in faults {
            let s = Setup::start(backend, honours, "").await;
            s.provider.fail_next(fault);
            assert_eq!(s.pay(1, 5, 100).await.status, status, "{fault:?}");
            assert_eq!(s.provider.charges().len(), 1);
            assert_eq!(
                s.submitting().await,
                ["payouts/payout:1"],
                "{fault:?}: listed for reconciliation"
            );
            let intent =
                s.gw.intents()
                    .get("payouts/payout:1")
                    .await
                    .unwrap()
                    .unwrap();
            assert_eq!(
                (intent.state, intent.attempt),
                (IntentState::Submitting, None)
            );

            let retry = s.pay(1, 5, 100).await;
            assert_eq!(retry.status, 201, "{fault:?}: the retry re-submits");
            let charges = s.provider.charges();
            assert!(
                charges.iter().all(|c| c.key.as_deref() == Some("payout:1")),
                "same key on every attempt"
            );
            assert_eq!(
                charges.len(),
                if honours { 1 } else { 2 },
                "{fault:?} honours={honours}"
            );
            assert!(s.submitting().await.is_empty(), "the outcome is known now");
            // Known now: never another call.
            let replay = s.pay(1, 5, 100).await;
            assert_eq!(replay.header("idempotent-replayed"), Some("true"));
            assert_eq!(s.provider.charges().len(), charges.len());
            s.finish().await;
        }
    }
}

/// `on_unknown_outcome = "hold"`, for a provider that ignores the key: an unknown outcome is never
/// sent again, by the same holder or a newer one, until an operator records what happened.
async fn a_route_that_holds_unknown_outcomes_never_sends_them_again(backend: Backend) {
    let faults = [
        (Fault::DropConnection, 502),
        (Fault::Answer500, 500),
        (Fault::AnswerLate(Duration::from_millis(1500)), 504),
    ];
    for (fault, status) in faults {
        let s = Setup::start(backend, false, "on_unknown_outcome = \"hold\"").await;
        s.provider.fail_next(fault);
        assert_eq!(s.pay(1, 5, 100).await.status, status, "{fault:?}");
        assert_eq!(s.provider.charges().len(), 1);
        for fence in [5, 6] {
            let retry = s.pay(1, fence, 100).await;
            assert_eq!(
                (retry.status.as_u16(), retry.problem_slug().as_str()),
                (409, "outcome-unknown"),
                "{fault:?}: fence {fence} is held"
            );
        }
        assert_eq!(s.provider.calls(), 1, "{fault:?}: nothing was sent again");
        assert_eq!(s.submitting().await, ["payouts/payout:1"]);
        let (state, _) = s.intent_of(1).await;
        assert_eq!(state, IntentState::Submitting);

        // The operator reads the provider's record (charged) and records it.
        let outcome = StoredOutcome {
            status: 201,
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: bytes::Bytes::from_static(b"{\"charged\":true}"),
            body_complete: true,
        };
        let now = fencegate::idempotency::now_ms();
        assert!(s
            .gw
            .intents()
            .resolve("payouts/payout:1", Resolution::Outcome(outcome), now)
            .await
            .unwrap());
        let replay = s.pay(1, 6, 100).await;
        assert_eq!(replay.status, 201, "{fault:?}");
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(replay.body.as_ref(), b"{\"charged\":true}");
        assert_eq!(
            s.provider.charges().len(),
            1,
            "{fault:?}: one charge in all"
        );
        s.finish().await;
    }
}

/// A refused connection certainly sent nothing: the intent is forgotten, not left SUBMITTING,
/// so even a route that holds unknown outcomes submits the retry.
async fn a_refused_connection_leaves_no_intent(backend: Backend) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    for extra in ["", "on_unknown_outcome = \"hold\""] {
        let s = Setup::start_towards(backend, Some(upstream.clone()), false, extra, "").await;
        let refused = s.pay(1, 5, 100).await;
        assert_eq!(
            (refused.status.as_u16(), refused.problem_slug().as_str()),
            (502, "upstream-unavailable"),
            "{extra}"
        );
        assert!(
            s.submitting().await.is_empty(),
            "{extra}: nothing to reconcile"
        );
        let record = s.gw.intents().get("payouts/payout:1").await.unwrap();
        assert_eq!(record, None, "{extra}");
        let again = s.pay(1, 5, 100).await;
        assert_eq!(again.status, 502, "{extra}: tried again, refused again");
        s.finish().await;
    }
}

async fn a_new_holder_resubmits_after_the_old_one_vanished(backend: Backend) {
    let s = Setup::start(backend, true, "").await;
    s.provider.fail_next(Fault::DropConnection);
    assert_eq!(
        s.pay(1, 5, 100).await.status,
        502,
        "the old holder's call was lost"
    );
    let new_holder = s.pay(1, 6, 100).await;
    assert_eq!(new_holder.status, 201);
    assert_eq!(
        s.provider.charges().len(),
        1,
        "the provider recognised the key: one charge"
    );
    assert_eq!(s.provider.calls(), 2);
    assert_eq!(s.intent_of(1).await, (IntentState::Completed, 6));
    // The superseded holder comes back: refused by the fence before any replay.
    let zombie = s.pay(1, 5, 100).await;
    assert_eq!(zombie.status, 409);
    assert_eq!(zombie.problem_slug(), "stale-fence");
    assert!(zombie.header("idempotent-replayed").is_none());
    s.finish().await;
}

/// With no cache in front of the store, a superseded holder's token is refused by the store's
/// own compare-and-advance, which comes before the intent: a stale retry with another body is
/// "stale-fence" (not 422 for a reused key), and nothing reaches the provider.
async fn a_stale_token_is_refused_before_the_intent_without_a_cache(backend: Backend) {
    let s = Setup::start_with_store(backend, true, "", "cache_capacity = 0").await;
    assert_eq!(s.pay(1, 6, 100).await.status, 201);
    let zombie = s.pay(1, 5, 999).await;
    assert_eq!(zombie.status, 409);
    assert_eq!(zombie.problem_slug(), "stale-fence");
    assert_eq!(s.provider.calls(), 1);
    assert_eq!(s.intent_of(1).await, (IntentState::Completed, 6));
    // The holder's own retry is still replayed.
    let again = s.pay(1, 6, 100).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    s.finish().await;
}

async fn concurrent_duplicates_reach_the_provider_once(backend: Backend) {
    let s = Setup::start(backend, false, "").await;
    s.provider
        .fail_next(Fault::AnswerLate(Duration::from_millis(300)));
    let url = s.gw.url("/payouts/1");
    let duplicates = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                send("POST", &url, &[("x-fence", "5")], "{\"amount\":100}").await
            })
        })
        .collect::<Vec<_>>();
    let mut statuses = Vec::new();
    for duplicate in duplicates {
        let reply = duplicate.await.unwrap();
        if reply.status == 409 {
            assert_eq!(reply.problem_slug(), "request-in-progress");
            assert!(reply.header("retry-after").is_some());
        }
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        7,
        "{statuses:?}"
    );
    assert_eq!(
        s.provider.calls(),
        1,
        "the provider saw one call although it ignores keys"
    );
    assert_eq!(
        s.pay(1, 5, 100).await.header("idempotent-replayed"),
        Some("true")
    );
    s.finish().await;
}

async fn a_key_reused_for_another_request_is_422(backend: Backend) {
    let s = Setup::start(backend, true, "").await;
    assert_eq!(s.pay(1, 5, 100).await.status, 201);
    let other = s.pay(1, 5, 999).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.problem_slug(), "idempotency-key-reused");
    assert_eq!(s.provider.calls(), 1);
    s.finish().await;
}

async fn client_keys_per_policy(backend: Backend) {
    let s = Setup::start(backend, true, "client_key = \"require\"").await;
    let missing = s.pay(1, 5, 100).await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.problem_slug(), "idempotency-key-required");
    let url = s.gw.url("/payouts/1");
    let with_key = send(
        "POST",
        &url,
        &[("x-fence", "5"), (KEY_HEADER, "client-123")],
        "{}",
    )
    .await;
    assert_eq!(with_key.status, 201);
    assert_eq!(s.provider.charges()[0].key.as_deref(), Some("client-123"));
    s.finish().await;

    // replace (the default): the client's key is not what the provider sees.
    let s = Setup::start(backend, true, "").await;
    let url = s.gw.url("/payouts/2");
    assert_eq!(
        send(
            "POST",
            &url,
            &[("x-fence", "5"), (KEY_HEADER, "client-123")],
            "{}"
        )
        .await
        .status,
        201
    );
    assert_eq!(s.provider.charges()[0].key.as_deref(), Some("payout:2"));
    s.finish().await;
}

/// A response longer than `max_stored_body` is answered whole (and stored without its body).
/// Before the fix, the body that yields the captured start and then the rest reported a size
/// hint whose lower bound passed its upper one when the provider's answer had a length: hyper
/// panicked on it and the client saw its connection close without an answer.
async fn a_response_longer_than_the_stored_body_is_answered_whole(backend: Backend) {
    let s = Setup::start(backend, true, "max_stored_body = \"4B\"").await;
    let first = s.pay(9, 5, 100).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert!(first.body.len() > 4, "{:?}", first.body);
    assert_eq!(
        first.header("content-length"),
        Some(first.body.len().to_string().as_str())
    );
    let again = s.pay(9, 5, 100).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(s.provider.charges().len(), 1);
    s.finish().await;
}

macro_rules! on_every_backend {
    ($($scenario:ident),* $(,)?) => {
        mod embedded { use super::*; $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $scenario() { super::$scenario(Backend::Embedded).await } )* }
        mod postgres { use super::*; $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $scenario() { super::$scenario(Backend::Postgres).await } )* }
        mod redis { use super::*; $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $scenario() { super::$scenario(Backend::Redis).await } )* }
        mod etcd { use super::*; $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $scenario() { super::$scenario(Backend::Etcd).await } )* }
    };
}

on_every_backend!(
    retries_by_the_same_holder_are_replayed,
    unknown_outcomes_are_listed_and_resubmitted_with_the_same_key,
    a_route_that_holds_unknown_outcomes_never_sends_them_again,
    a_refused_connection_leaves_no_intent,
    a_new_holder_resubmits_after_the_old_one_vanished,
    a_stale_token_is_refused_before_the_intent_without_a_cache,
    concurrent_duplicates_reach_the_provider_once,
    a_key_reused_for_another_request_is_422,
    client_keys_per_policy,
    a_response_longer_than_the_stored_body_is_answered_whole,
);
