//! Idempotency keys in the form a provider accepts (`key_format`, `max_key_length`): the same key
//! on every attempt, shaped as the provider validates it, and refused before anything is recorded
//! when it cannot fit.

use std::path::Path;

use crate::support::client::send;
use crate::support::gateway::TestGateway;
use crate::support::upstream::{Behavior, RecordingUpstream};

fn payouts(upstream: &str, idempotency: &str) -> String {
    format!(
        "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"payout:{{id}}\"\n\n[routes.fence]\nmode = \"off\"\n\n[routes.idempotency]\n{idempotency}\n"
    )
}

#[tokio::test]
async fn a_uuid_key_is_stable_and_in_version_4_form() {
    std::env::set_var("FENCEGATE_TEST_KEY_SECRET", "provider-key-secret");
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&payouts(
        &upstream.url(),
        "key = \"payout:{id}\"\nhmac_secret_env = \"FENCEGATE_TEST_KEY_SECRET\"\nkey_format = \"uuid\"\n",
    ))
    .await;
    for id in ["7", "8"] {
        let reply = send("POST", &gw.url(&format!("/payouts/{id}")), &[], "amount=1").await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
    }
    let keys: Vec<String> = upstream
        .seen()
        .iter()
        .map(|s| s.header("idempotency-key").expect("a key").to_owned())
        .collect();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1]);
    for key in &keys {
        let parsed = uuid::Uuid::parse_str(key).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(parsed.get_version_num(), 4, "{key}");
        assert_eq!(key.len(), 36);
    }
    // Another gateway with the same secret derives the same key for the same payout: any holder,
    // any replica, sends one key per operation.
    let other = RecordingUpstream::start(Behavior::Ok).await;
    let gw2 = TestGateway::start(&payouts(
        &other.url(),
        "key = \"payout:{id}\"\nhmac_secret_env = \"FENCEGATE_TEST_KEY_SECRET\"\nkey_format = \"uuid\"\n",
    ))
    .await;
    send("POST", &gw2.url("/payouts/7"), &[], "amount=1").await;
    assert_eq!(
        other.seen()[0].header("idempotency-key"),
        Some(keys[0].as_str())
    );
}

#[tokio::test]
async fn digests_are_cut_to_max_key_length_and_long_raw_keys_are_refused() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&format!(
        "{}{}",
        payouts(
            &upstream.url(),
            "key = \"payout:{id}\"\nkey_format = \"base64url\"\nmax_key_length = 32\n"
        ),
        payouts(
            &upstream.url(),
            "key = \"payout:{id}\"\nmax_key_length = 12\n"
        )
        .replace("name = \"payouts\"", "name = \"raw\"")
        .replace("/payouts/", "/raw/")
    ))
    .await;
    let reply = send("POST", &gw.url("/payouts/7"), &[], "").await;
    assert_eq!(reply.status, 200);
    let key = upstream.seen()[0]
        .header("idempotency-key")
        .expect("a key")
        .to_owned();
    assert_eq!(key.len(), 32, "{key}");
    assert!(
        key.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{key}"
    );

    // "payout:7" fits in 12; "payout:1234567" does not, and nothing is recorded or sent.
    assert_eq!(send("POST", &gw.url("/raw/7"), &[], "").await.status, 200);
    let refused = send("POST", &gw.url("/raw/1234567"), &[], "").await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.problem_slug(), "idempotency-key-too-long");
    assert_eq!(upstream.seen().len(), 2);
}

fn compile(idempotency: &str) -> Result<(), String> {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n{}",
        payouts("http://127.0.0.1:1", idempotency)
    );
    fencegate::Compiled::parse(&text, Path::new("keys.toml"))
        .map(drop)
        .map_err(|e| e.to_string())
}

#[test]
fn check_config_holds_the_format_to_the_length() {
    std::env::set_var("FENCEGATE_TEST_KEY_SECRET_2", "s");
    let secret = "hmac_secret_env = \"FENCEGATE_TEST_KEY_SECRET_2\"\n";
    let e = compile(&format!(
        "key = \"p:{{id}}\"\n{secret}key_format = \"raw\"\n"
    ))
    .unwrap_err();
    assert!(e.contains("idempotency.key_format"), "{e}");
    let e = compile("key = \"p:{id}\"\nkey_format = \"uuid\"\nmax_key_length = 32\n").unwrap_err();
    assert!(e.contains("max_key_length") && e.contains("36"), "{e}");
    let e = compile("key = \"p:{id}\"\nkey_format = \"hex\"\nmax_key_length = 31\n").unwrap_err();
    assert!(e.contains("128 bits"), "{e}");
    let e = compile("key = \"p:{id}\"\nkey_format = \"base64\"\n").unwrap_err();
    assert!(e.contains("key_format"), "{e}");
    assert_eq!(
        compile("key = \"p:{id}\"\nkey_format = \"hex\"\nmax_key_length = 40\n"),
        Ok(())
    );
    assert_eq!(
        compile("key = \"p:{id}\"\nkey_format = \"base64url\"\nmax_key_length = 22\n"),
        Ok(())
    );
}

/// `{resource_key}` is the request's resource key even where the fence admitted nothing: a
/// `mode = "off"` route, or an observed refusal (a stale token under `mode = "observe"`), which is
/// forwarded. Two resources never share an idempotency key, so neither is answered with the
/// other's stored outcome.
#[tokio::test]
async fn resource_key_in_a_key_template_is_the_requests_without_an_admission() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let observe = payouts(&upstream.url(), "key = \"{resource_key}\"\n")
        .replace("mode = \"off\"", "mode = \"observe\"");
    let off = payouts(&upstream.url(), "key = \"{resource_key}\"\n")
        .replace("name = \"payouts\"", "name = \"plain\"")
        .replace("/payouts/", "/plain/");
    let gw = TestGateway::start(&format!("{observe}{off}")).await;
    for key in ["payout:7", "payout:8"] {
        let claim = send(
            "POST",
            &gw.url(&format!("/_fencegate/claim/{key}")),
            &[("x-fence", "10")],
            "",
        )
        .await;
        assert_eq!(claim.status, 200);
    }
    for path in ["/payouts/7", "/payouts/8", "/plain/7", "/plain/8"] {
        let reply = send("POST", &gw.url(path), &[("x-fence", "5")], "amount=1").await;
        assert_eq!(reply.status, 200, "{path}: {:?}", reply.body);
        assert!(
            reply.headers.get("idempotent-replayed").is_none(),
            "{path} was answered with another resource's outcome"
        );
    }
    let keys: Vec<String> = upstream
        .seen()
        .iter()
        .map(|s| s.header("idempotency-key").expect("a key").to_owned())
        .collect();
    assert_eq!(keys, ["payout:7", "payout:8", "payout:7", "payout:8"]);
}
