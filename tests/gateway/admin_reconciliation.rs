//! Reconciliation through the admin API while the gateway serves, on every backend (embedded,
//! PostgreSQL, Redis, etcd): an intent left SUBMITTING by an upstream that answered 5xx or timed
//! out is listed and read by its percent-encoded key; the provider's outcome recorded with
//! `POST /admin/intents/{key}/resolve` is replayed to the client's repeat without calling the
//! upstream; a released intent is sent again with the same idempotency key; a route that holds
//! unknown outcomes refuses repeats until the operator resolves them; and unknown keys and
//! malformed resolutions are problem documents that change nothing.
//!
//! The network backends fail (never skip) when their server is not reachable
//! (`support::namespace_in_task::with_namespace_in_task`).

use std::future::Future;
use std::time::Duration;

use serde_json::json;

use crate::support::admin_api::{metric, AdminApi};
use crate::support::namespace_in_task::with_namespace_in_task;
use crate::support::network_store::Backend;
use crate::support::provider::{Fault, Provider};
use crate::support::{send, Reply, TestGateway};

const TOKEN: &str = "reconcile-admin-token-0123456789";

/// What the operator read in the provider's dashboard.
const OUTCOME: &str = r#"{"status": 201, "headers": {"content-type": "application/json"}, "body": "{\"id\":\"po_1\"}"}"#;
const RELEASE: &str = r#"{"release": true}"#;

/// Where the gateway keeps its marks and intents.
#[derive(Clone, Copy, Debug)]
enum Store {
    Embedded,
    Network(Backend),
}

/// Runs `scenario` with the `[store]` table of `store` (`None`: the builder's embedded store),
/// in a namespace of its own that is removed afterwards on a network backend.
async fn on_store<F, Fut>(store: Store, scenario: F)
where
    F: FnOnce(Option<String>) -> Fut,
    Fut: Future<Output = ()>,
{
    match store {
        Store::Embedded => scenario(None).await,
        Store::Network(backend) => {
            with_namespace_in_task(backend, |namespace| {
                scenario(Some(backend.store_toml(backend.addr(), &namespace)))
            })
            .await
        }
    }
}

/// A client's answer as its status and body text, for messages that read.
fn answer(reply: &Reply) -> (u16, String) {
    (
        reply.status.as_u16(),
        String::from_utf8_lossy(&reply.body).into_owned(),
    )
}

/// A gateway with two idempotent routes to one fake provider that ignores idempotency keys:
/// `payouts` sends an unknown outcome again on a repeat (the default), `held` holds it for an
/// operator. Both time out after 500 ms.
struct Payouts {
    gw: TestGateway,
    provider: Provider,
    admin: AdminApi,
}

impl Payouts {
    async fn start(store_toml: Option<String>) -> Payouts {
        let provider = Provider::start(false).await;
        let route = |name: &str, key: &str, extra: &str| {
            format!(
                "[[routes]]\nname = \"{name}\"\npath = \"/{name}/{{id}}\"\nupstream = \"{}\"\nresource_key = \"{key}:{{id}}\"\ntimeout = \"500ms\"\n\n[routes.idempotency]\nkey = \"{key}:{{id}}\"\n{extra}\n",
                provider.url()
            )
        };
        let routes = format!(
            "{}{}",
            route("payouts", "payout", ""),
            route("held", "held", "on_unknown_outcome = \"hold\"\n")
        );
        let mut builder = TestGateway::builder(&routes).admin(TOKEN);
        if let Some(store_toml) = &store_toml {
            builder = builder.store_toml(store_toml);
        }
        let gw = builder.start().await;
        let admin = AdminApi::of(&gw, TOKEN);
        Payouts {
            gw,
            provider,
            admin,
        }
    }

    /// The client's write of `/{route}/{id}`: the same request every time it is repeated.
    async fn pay(&self, route: &str, id: u32) -> Reply {
        send(
            "POST",
            &self.gw.url(&format!("/{route}/{id}")),
            &[("x-fence", "1")],
            "{\"amount\":100}",
        )
        .await
    }

    /// The intent of `key` as `GET /admin/intents/{key}` shows it; it must exist.
    async fn intent(&self, key: &str) -> serde_json::Value {
        let reply = self.admin.intent(key).await;
        assert_eq!(reply.status, 200, "{key}: {:?}", reply.body);
        reply.json()
    }
}

async fn a_recorded_outcome_is_replayed_without_calling_the_upstream(store: Option<String>) {
    let s = Payouts::start(store).await;
    s.provider.fail_next(Fault::Answer500);
    assert_eq!(s.pay("payouts", 1).await.status, 500);
    let key = "payouts/payout:1";
    assert_eq!(s.admin.submitting().await, [key]);
    let exposition = s.admin.metrics().await;
    assert_eq!(
        metric(&exposition, "fencegate_intents{state=\"submitting\"}"),
        Some(1.0),
        "the unknown outcome is counted"
    );
    let age = metric(
        &exposition,
        "fencegate_intent_oldest_submitting_age_seconds",
    );
    assert!(
        age.is_some_and(|age| (0.0..60.0).contains(&age)),
        "the oldest SUBMITTING intent's age: {age:?}"
    );
    let intent = s.intent(key).await;
    assert_eq!(
        (&intent["key"], &intent["route"], &intent["state"]),
        (&json!(key), &json!("payouts"), &json!("SUBMITTING"))
    );
    assert_eq!(intent["outcome"], json!(null));

    let resolved = s.admin.resolve(key, OUTCOME).await;
    assert_eq!(resolved.status, 200, "{:?}", resolved.body);
    assert_eq!(
        resolved.json(),
        json!({"key": key, "resolution": "outcome"})
    );

    // Without the recorded outcome this route would send the repeat again (see
    // `a_released_intent_is_sent_again_with_the_same_key`): the replay proves it is in the store.
    let repeat = s.pay("payouts", 1).await;
    assert_eq!(answer(&repeat), (201, "{\"id\":\"po_1\"}".to_owned()));
    assert_eq!(repeat.header("idempotent-replayed"), Some("true"));
    assert_eq!(repeat.header("content-type"), Some("application/json"));
    assert_eq!(
        s.provider.calls(),
        1,
        "the repeat never reached the upstream"
    );

    let done = s.intent(key).await;
    assert_eq!(done["state"], "COMPLETED");
    assert_eq!(done["outcome"]["status"], 201);
    assert_eq!(done["outcome"]["body"], "{\"id\":\"po_1\"}");
    assert_eq!(
        done["outcome"]["headers"]["content-type"],
        "application/json"
    );
    assert!(
        s.admin.submitting().await.is_empty(),
        "a resolved intent is not listed"
    );
    let exposition = s.admin.metrics().await;
    assert_eq!(
        metric(&exposition, "fencegate_intents{state=\"submitting\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &exposition,
            "fencegate_intent_oldest_submitting_age_seconds"
        ),
        Some(0.0)
    );
    assert_eq!(
        metric(&exposition, "fencegate_intents{state=\"completed\"}"),
        Some(1.0),
        "the resolved outcome is held for replay"
    );

    // Its outcome is known: neither another outcome nor a release is taken.
    for body in [RELEASE, r#"{"status": 500, "body": "other"}"#] {
        let again = s.admin.resolve(key, body).await;
        assert_eq!(again.status, 409, "{body}");
        assert_eq!(again.problem_slug(), "intent-not-submitting", "{body}");
        assert_eq!(again.json()["key"], key);
    }
    assert_eq!(s.intent(key).await["outcome"]["body"], "{\"id\":\"po_1\"}");
    let replay = s.pay("payouts", 1).await;
    assert_eq!(answer(&replay), (201, "{\"id\":\"po_1\"}".to_owned()));
    assert_eq!(s.provider.calls(), 1);
    s.gw.stop().await;
}

async fn a_released_intent_is_sent_again_with_the_same_key(store: Option<String>) {
    let s = Payouts::start(store).await;
    // The provider charges, then answers after the route's 500 ms timeout.
    s.provider
        .fail_next(Fault::AnswerLate(Duration::from_millis(1500)));
    assert_eq!(s.pay("held", 2).await.status, 504);
    let key = "held/held:2";
    assert_eq!(s.intent(key).await["state"], "SUBMITTING");
    let held = s.pay("held", 2).await;
    assert_eq!(
        (held.status.as_u16(), held.problem_slug().as_str()),
        (409, "outcome-unknown"),
        "held until an operator says what happened"
    );
    assert_eq!(s.provider.calls(), 1);

    let released = s.admin.resolve(key, RELEASE).await;
    assert_eq!(released.status, 200, "{:?}", released.body);
    assert_eq!(
        released.json(),
        json!({"key": key, "resolution": "released"})
    );
    assert!(s.admin.submitting().await.is_empty());

    let fresh = s.pay("held", 2).await;
    assert_eq!(fresh.status, 201, "{:?}", fresh.body);
    assert!(
        fresh.header("idempotent-replayed").is_none(),
        "a released intent is submitted afresh"
    );
    assert_eq!(s.provider.calls(), 2, "the repeat reached the upstream");
    let keys: Vec<_> = s.provider.charges().into_iter().map(|c| c.key).collect();
    assert_eq!(
        keys,
        [Some("held:2".to_owned()), Some("held:2".to_owned())],
        "the same idempotency key on both attempts"
    );
    let done = s.intent(key).await;
    assert_eq!(
        (&done["state"], &done["outcome"]["status"]),
        (&json!("COMPLETED"), &json!(201))
    );
    s.gw.stop().await;
}

async fn a_held_intent_is_refused_until_its_outcome_is_recorded(store: Option<String>) {
    let s = Payouts::start(store).await;
    s.provider.fail_next(Fault::Answer500);
    assert_eq!(s.pay("held", 3).await.status, 500);
    let key = "held/held:3";
    for _ in 0..2 {
        let held = s.pay("held", 3).await;
        assert_eq!(
            (held.status.as_u16(), held.problem_slug().as_str()),
            (409, "outcome-unknown")
        );
    }
    assert_eq!(s.provider.calls(), 1, "nothing was sent again");
    assert_eq!(s.admin.submitting().await, [key]);

    let resolved = s.admin.resolve(key, OUTCOME).await;
    assert_eq!(resolved.status, 200, "{:?}", resolved.body);
    let replay = s.pay("held", 3).await;
    assert_eq!(answer(&replay), (201, "{\"id\":\"po_1\"}".to_owned()));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(s.provider.calls(), 1, "one call in all");
    s.gw.stop().await;
}

async fn unknown_keys_and_malformed_resolutions_are_problems(store: Option<String>) {
    let s = Payouts::start(store).await;
    s.provider.fail_next(Fault::Answer500);
    assert_eq!(s.pay("payouts", 4).await.status, 500);
    let key = "payouts/payout:4";

    for missing in ["payouts/payout:404", "nope"] {
        let read = s.admin.intent(missing).await;
        assert_eq!(read.status, 404, "{missing}");
        assert_eq!(read.problem_slug(), "no-intent");
        assert_eq!(read.json()["key"], missing);
        for body in [OUTCOME, RELEASE] {
            let resolved = s.admin.resolve(missing, body).await;
            assert_eq!(resolved.status, 404, "{missing} {body}");
            assert_eq!(resolved.problem_slug(), "no-intent");
        }
    }

    let malformed = [
        "{}",
        r#"{"release": false}"#,
        r#"{"status": 99}"#,
        // A 1xx is never final: replayed, it would break every repeat.
        r#"{"status": 103}"#,
        r#"{"status": 600}"#,
        r#"{"status": 200, "release": true}"#,
        r#"{"status": 201, "headers": {"bad name": "x"}}"#,
        r#"{"status": 201, "colour": "red"}"#,
        r#"{"status": "201"}"#,
        "not JSON",
        "",
        // A recorded framing header would frame the replay wrongly: a 5-byte body sent as 999.
        r#"{"status": 201, "headers": {"content-length": "999"}, "body": "hello"}"#,
        r#"{"status": 201, "headers": {"Transfer-Encoding": "chunked"}, "body": "hello"}"#,
        // A release records nothing: a body or headers with it are a mistake.
        r#"{"release": true, "body": "ignored"}"#,
        r#"{"release": true, "headers": {"x-a": "b"}}"#,
    ];
    for body in malformed {
        let refused = s.admin.resolve(key, body).await;
        assert_eq!(refused.status, 400, "{body}: {:?}", refused.body);
        assert_eq!(refused.problem_slug(), "invalid-body", "{body}");
        assert_eq!(refused.json()["status"], 400);
    }
    // None of them touched the intent.
    let intent = s.intent(key).await;
    assert_eq!(
        (&intent["state"], &intent["outcome"]),
        (&json!("SUBMITTING"), &json!(null))
    );
    assert_eq!(s.admin.submitting().await, [key]);
    // The key as the API documentation spells it, with only its `/` encoded.
    let documented = s.admin.get("/admin/intents/payouts%2Fpayout:4").await;
    assert_eq!(documented.status, 200);
    assert_eq!(documented.json()["key"], key);
    s.gw.stop().await;
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::on_store(super::Store::Embedded, super::$scenario).await
                }
            )*
        }
        mod postgres {
            use crate::support::network_store::Backend;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::on_store(super::Store::Network(Backend::Postgres), super::$scenario)
                        .await
                }
            )*
        }
        mod redis {
            use crate::support::network_store::Backend;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::on_store(super::Store::Network(Backend::Redis), super::$scenario).await
                }
            )*
        }
        mod etcd {
            use crate::support::network_store::Backend;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::on_store(super::Store::Network(Backend::Etcd), super::$scenario).await
                }
            )*
        }
    };
}

on_every_store!(
    a_recorded_outcome_is_replayed_without_calling_the_upstream,
    a_released_intent_is_sent_again_with_the_same_key,
    a_held_intent_is_refused_until_its_outcome_is_recorded,
    unknown_keys_and_malformed_resolutions_are_problems,
);
