//! A gateway killed with `kill -9` between the provider's charge and the outcome record, then
//! restarted (on every backend): the intent survived as SUBMITTING, a retry waits out the dead attempt's lease and
//! re-submits with the same key, and a provider that honours keys charges once.

use std::time::{Duration, Instant};

use crate::support;
use crate::support::provider::{Fault, Provider};
use crate::support::{send, GatewayProcess};

async fn killed_between_charge_and_record(store: &str) {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let store = if store.is_empty() {
        support::gateway::embedded_store(dir.path())
    } else {
        store.to_owned()
    };
    let route = format!(
        "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{}\"\nresource_key = \"payout:{{id}}\"\ntimeout = \"1s\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\n",
        provider.url()
    );
    let gateway = GatewayProcess::start_with_store(dir.path(), &store, &route);
    provider.fail_next(Fault::AnswerLate(Duration::from_millis(800)));
    let url = gateway.url("/payouts/1");
    let lost = tokio::spawn(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let request = http::Request::post(url)
            .header("x-fence", "5")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"{\"amount\":100}",
            )))
            .unwrap();
        client.request(request).await.is_ok()
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while provider.charges().is_empty() {
        assert!(Instant::now() < deadline, "the provider was never called");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Charged, not yet answered: the gateway dies before it can record the outcome.
    gateway.kill_9();
    assert!(!lost.await.unwrap(), "the client never got an answer");

    let restarted = GatewayProcess::start_with_store(dir.path(), &store, &route);
    // The dead attempt's lease (route timeout + 5 s) still covers the intent: the retry is told to
    // come back later, and nothing reaches the provider.
    let early = send(
        "POST",
        &restarted.url("/payouts/1"),
        &[("x-fence", "5")],
        "{\"amount\":100}",
    )
    .await;
    assert_eq!(early.status, 409);
    assert_eq!(early.problem_slug(), "request-in-progress");
    assert_eq!(provider.calls(), 1);
    let deadline = Instant::now() + Duration::from_secs(15);
    let retry = loop {
        let retry = send(
            "POST",
            &restarted.url("/payouts/1"),
            &[("x-fence", "5")],
            "{\"amount\":100}",
        )
        .await;
        if retry.status != 409 || Instant::now() > deadline {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    let charges = provider.charges();
    assert_eq!(
        charges.len(),
        1,
        "one charge: the retry carried the same key"
    );
    assert_eq!(provider.calls(), 2);
    assert!(charges.iter().all(|c| c.key.as_deref() == Some("payout:1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_gateway_killed_between_charge_and_record_does_not_charge_twice() {
    killed_between_charge_and_record("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_gateway_killed_between_charge_and_record_does_not_charge_twice() {
    let schema = support::postgres::unique_schema();
    let store = format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{}\"\nschema = \"{schema}\"\n",
        support::postgres::TEST_POSTGRES_URL
    );
    killed_between_charge_and_record(&store).await;
    support::postgres::drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_gateway_killed_between_charge_and_record_does_not_charge_twice() {
    let prefix = support::redis::unique_prefix();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n",
        support::redis::redis_url()
    );
    killed_between_charge_and_record(&store).await;
    support::redis::delete_keys(&prefix).await;
}
