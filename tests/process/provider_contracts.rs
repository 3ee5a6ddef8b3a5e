//! What the provider's answers mean to an idempotent route, through the real binary. Answers that
//! say the provider did nothing (`transient_statuses`, by default 408, 409, 423, 425 and 429) are
//! not outcomes: the client gets the provider's answer with its `Retry-After`, nothing is
//! recorded, and the next attempt with the same key goes to the provider and is charged once. A
//! final refusal (402) is recorded and replayed as before. The provider's own replays (its
//! `Idempotent-Replayed`) are passed on and counted apart from the gateway's. The key can be sent
//! as the IETF draft's Structured Fields string.

use crate::support::process::Launch;
use crate::support::provider::Provider;
use crate::support::{send, GatewayProcess};

fn payouts(provider: &Provider, extra: &str) -> String {
    idempotent_route(provider, "payouts", "payout:{id}", extra)
}

/// An unfenced idempotent route `/NAME/{id}` to `provider`, keyed by `key`, with the TOML lines
/// `extra` in its `[routes.idempotency]` table.
fn idempotent_route(provider: &Provider, name: &str, key: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\npath = \"/{name}/{{id}}\"\nupstream = \"{}\"\nresource_key = \"payout:{{id}}\"\ntimeout = \"2s\"\n\n[routes.fence]\nmode = \"off\"\n\n[routes.idempotency]\nkey = \"{key}\"\n{extra}\n",
        provider.url()
    )
}

/// Whether the gateway or the provider marked `reply` as a replay.
fn replayed(reply: &crate::support::Reply) -> bool {
    reply
        .headers
        .get("idempotent-replayed")
        .map(|v| v.as_bytes())
        == Some(&b"true"[..])
}

#[tokio::test]
async fn a_rate_limited_attempt_is_released_and_the_retry_reaches_the_provider() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let gateway = GatewayProcess::start(dir.path(), &payouts(&provider, ""));
    for (status, id) in [(429, "1"), (409, "2"), (408, "3")] {
        provider.refuse_next(status);
        let url = gateway.url(&format!("/payouts/{id}"));
        let refused = send("POST", &url, &[], "amount=1").await;
        assert_eq!(refused.status.as_u16(), status, "{:?}", refused.body);
        assert_eq!(
            refused.headers.get("retry-after").map(|v| v.as_bytes()),
            Some(&b"2"[..]),
            "{status}: Retry-After passed through"
        );
        let retried = send("POST", &url, &[], "amount=1").await;
        assert_eq!(
            retried.status.as_u16(),
            201,
            "{status}: the retry was answered from a stored {status}: {:?}",
            retried.body
        );
        assert!(!replayed(&retried));
    }
    assert_eq!(provider.calls(), 6);
    let charged: Vec<Option<String>> = provider.charges().into_iter().map(|c| c.key).collect();
    assert_eq!(
        charged,
        [
            Some("payout:1".to_owned()),
            Some("payout:2".to_owned()),
            Some("payout:3".to_owned())
        ]
    );
}

#[tokio::test]
async fn a_final_refusal_is_recorded_and_replayed_and_the_list_can_be_emptied() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let gateway = GatewayProcess::start(dir.path(), &payouts(&provider, "transient_statuses = []"));
    for (status, id) in [(402, "1"), (429, "2")] {
        provider.refuse_next(status);
        let url = gateway.url(&format!("/payouts/{id}"));
        let first = send("POST", &url, &[], "amount=1").await;
        assert_eq!(first.status.as_u16(), status);
        let again = send("POST", &url, &[], "amount=1").await;
        assert_eq!(again.status.as_u16(), status, "{status} replayed");
        assert!(replayed(&again));
    }
    assert_eq!(provider.calls(), 2);
    assert!(provider.charges().is_empty());
}

/// The value of one series in a Prometheus exposition (0 when absent).
fn series(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn the_providers_replays_are_counted_as_the_providers_not_the_gateways() {
    let provider = Provider::start(true).await;
    provider.mark_replays();
    let dir = tempfile::tempdir().unwrap();
    // Two routes send the same key to the provider: the second one's first call is answered
    // from the provider's record.
    let routes = format!(
        "{}{}",
        payouts(&provider, ""),
        idempotent_route(&provider, "again", "payout:{id}", "")
    );
    let token = "provider-replays-admin-token";
    let gateway = Launch::new().admin(token, "").start(dir.path(), &routes);
    let first = send("POST", &gateway.url("/payouts/1"), &[], "amount=1").await;
    assert_eq!(first.status.as_u16(), 201);
    let by_provider = send("POST", &gateway.url("/again/1"), &[], "amount=1").await;
    assert_eq!(by_provider.status.as_u16(), 201);
    assert!(
        replayed(&by_provider),
        "the provider's replay header is passed on"
    );
    let by_gateway = send("POST", &gateway.url("/payouts/1"), &[], "amount=1").await;
    assert_eq!(by_gateway.status.as_u16(), 201);
    assert_eq!(provider.calls(), 2);
    assert_eq!(provider.charges().len(), 1);
    let bearer = format!("Bearer {token}");
    let metrics = send(
        "GET",
        &gateway.admin_url("/metrics"),
        &[("authorization", &bearer)],
        "",
    )
    .await;
    let metrics = String::from_utf8(metrics.body.to_vec()).unwrap();
    let requests = |route: &str, outcome: &str| {
        series(
            &metrics,
            &format!("fencegate_requests_total{{outcome=\"{outcome}\",route=\"{route}\"}}"),
        )
    };
    assert_eq!(requests("again", "replayed"), 0, "{metrics}");
    assert_eq!(requests("again", "forwarded"), 1, "{metrics}");
    assert_eq!(requests("payouts", "replayed"), 1, "{metrics}");
    assert_eq!(
        series(
            &metrics,
            "fencegate_idempotency_provider_replays_total{route=\"again\"}"
        ),
        1,
        "{metrics}"
    );
}

/// `key_encoding = "sf-string"`: the key goes out as a Structured Fields string, as the IETF
/// httpapi draft defines the field; a client's own key (`client_key = "keep"`), quoted or not, is
/// recorded unquoted and sent quoted once.
#[tokio::test]
async fn keys_are_sent_as_structured_fields_strings_when_the_route_says_so() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let route = payouts(
        &provider,
        "key_encoding = \"sf-string\"\nclient_key = \"keep\"",
    );
    let gateway = GatewayProcess::start(dir.path(), &route);
    let derived = send("POST", &gateway.url("/payouts/1"), &[], "amount=1").await;
    assert_eq!(derived.status.as_u16(), 201);
    for client in ["\"ck-2\"", "ck-3", "\"a\\\"b\""] {
        let reply = send(
            "POST",
            &gateway.url("/payouts/9"),
            &[("idempotency-key", client)],
            "amount=1",
        )
        .await;
        assert_eq!(reply.status.as_u16(), 201, "{client}");
    }
    // The quoted and the bare spelling of one client key are one key: replayed.
    let again = send(
        "POST",
        &gateway.url("/payouts/9"),
        &[("idempotency-key", "\"ck-3\"")],
        "amount=1",
    )
    .await;
    assert!(replayed(&again));
    let keys: Vec<Option<String>> = provider.charges().into_iter().map(|c| c.key).collect();
    assert_eq!(
        keys,
        [
            Some("\"payout:1\"".to_owned()),
            Some("\"ck-2\"".to_owned()),
            Some("\"ck-3\"".to_owned()),
            Some("\"a\\\"b\"".to_owned()),
        ]
    );
}

/// A route keyed by a header the client may leave out (`key = "payout:{header:Payout-Id}"`), on a
/// fenced route whose advance the idempotency layer makes.
fn keyed_by_header(provider: &Provider, when_missing: &str) -> String {
    format!(
        "[[routes]]\nname = \"charges\"\npath = \"/charges/{{id}}\"\nupstream = \"{}\"\nresource_key = \"charge:{{id}}\"\ntimeout = \"2s\"\n\n[routes.idempotency]\nkey = \"payout:{{header:Payout-Id}}\"\n{when_missing}\n",
        provider.url()
    )
}

/// `POST /charges/1` with `headers`.
async fn charge(gateway: &GatewayProcess, headers: &[(&str, &str)]) -> crate::support::Reply {
    send("POST", &gateway.url("/charges/1"), headers, "a=1").await
}

#[tokio::test]
async fn a_missing_key_input_is_refused_passed_through_or_taken_from_the_client() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let gateway = GatewayProcess::start(dir.path(), &keyed_by_header(&provider, ""));
    let refused = charge(&gateway, &[("x-fence", "5")]).await;
    assert_eq!(refused.status.as_u16(), 400, "default: refuse");
    assert_eq!(provider.calls(), 0);
    drop(gateway);

    // passthrough: forwarded unkeyed and unrecorded, each time; the fence still holds.
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let route = keyed_by_header(&provider, "when_missing = \"passthrough\"");
    let gateway = GatewayProcess::start(dir.path(), &route);
    for _ in 0..2 {
        let reply = charge(&gateway, &[("x-fence", "5")]).await;
        assert_eq!(reply.status.as_u16(), 201, "{:?}", reply.body);
    }
    let keys: Vec<Option<String>> = provider.charges().into_iter().map(|c| c.key).collect();
    assert_eq!(keys, [None, None]);
    let stale = charge(&gateway, &[("x-fence", "4")]).await;
    assert_eq!(
        stale.status.as_u16(),
        409,
        "a stale unkeyed write is still fenced"
    );
    let keyed = charge(&gateway, &[("x-fence", "5"), ("payout-id", "7")]).await;
    assert_eq!(keyed.status.as_u16(), 201);
    assert_eq!(provider.charges()[2].key.as_deref(), Some("payout:7"));
    drop(gateway);

    // client_key: the client's own key when it sent one, else refused.
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let route = keyed_by_header(&provider, "when_missing = \"client_key\"");
    let gateway = GatewayProcess::start(dir.path(), &route);
    for _ in 0..2 {
        let reply = charge(
            &gateway,
            &[("x-fence", "5"), ("idempotency-key", "client-9")],
        )
        .await;
        assert_eq!(reply.status.as_u16(), 201);
    }
    let bare = charge(&gateway, &[("x-fence", "5")]).await;
    assert_eq!(bare.status.as_u16(), 400);
    assert_eq!(
        provider.calls(),
        1,
        "the repeat was replayed, the keyless call refused"
    );
    assert_eq!(provider.charges()[0].key.as_deref(), Some("client-9"));
}

/// `completed_when`: a provider that reports errors inside a 200 (GraphQL) has only answers whose
/// body says "completed" recorded; an error in a 200 is passed on and the next attempt goes to
/// the provider. Without the rule (the route `plain`) the error is recorded and replayed.
#[tokio::test]
async fn an_error_inside_a_200_is_not_recorded_as_the_outcome() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let routes = format!(
        "{}{}",
        payouts(
            &provider,
            "[routes.idempotency.completed_when]\npointer = \"/errors\"\nabsent = true"
        ),
        idempotent_route(&provider, "plain", "payout:{id}", "")
    );
    let gateway = GatewayProcess::start(dir.path(), &routes);
    let error = r#"{"data":null,"errors":[{"message":"processor unavailable"}]}"#;
    for (path, replayed_error) in [("/payouts/1", false), ("/plain/1", true)] {
        provider.answer_next(200, error);
        let first = send("POST", &gateway.url(path), &[], "amount=1").await;
        assert_eq!(
            (first.status.as_u16(), &first.body[..]),
            (200, error.as_bytes())
        );
        let retry = send("POST", &gateway.url(path), &[], "amount=1").await;
        if replayed_error {
            assert_eq!(
                &retry.body[..],
                error.as_bytes(),
                "{path}: the error replayed"
            );
        } else {
            assert_eq!(retry.status.as_u16(), 201, "{path}: {:?}", retry.body);
            let replay = send("POST", &gateway.url(path), &[], "amount=1").await;
            assert_eq!(replay.status.as_u16(), 201, "{path}: the charge replayed");
            assert!(replayed(&replay));
        }
    }
    assert_eq!(provider.charges().len(), 1);
}

/// Keys read from the body (`{json:/pointer}`, `{form:field}`) and put into it
/// (`inject = "json:/idempotency_key"`, as Square takes them): the provider gets the body the
/// client sent with the key as one more member, repeats are replayed, and a body that is not
/// JSON, lacks the input, names no string there or already carries another key is refused with
/// nothing forwarded and nothing recorded.
#[tokio::test]
async fn keys_are_read_from_the_body_and_put_into_it() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let routes = format!(
        "{}{}",
        idempotent_route(
            &provider,
            "payouts",
            "pay:{json:/reference_id}",
            "inject = \"json:/idempotency_key\"",
        ),
        idempotent_route(&provider, "orders", "order:{form:order}", "")
    );
    let gateway = Launch::new().start(dir.path(), &routes);
    let json = [("content-type", "application/json")];
    let body = r#"{"reference_id":"r-1","amount_money":{"amount":12345678901234567890123}}"#;
    let first = send("POST", &gateway.url("/payouts/1"), &json, body).await;
    assert_eq!(first.status.as_u16(), 201, "{:?}", first.body);
    let again = send("POST", &gateway.url("/payouts/1"), &json, body).await;
    assert!(replayed(&again));
    let charges = provider.charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(
        charges[0].key, None,
        "no key header when the key goes in the body"
    );
    assert_eq!(
        String::from_utf8(charges[0].body.to_vec()).unwrap(),
        r#"{"idempotency_key":"pay:r-1","reference_id":"r-1","amount_money":{"amount":12345678901234567890123}}"#
    );
    for refused in [
        r#"{"reference_id":"r-2","idempotency_key":"mine"}"#,
        r#"{"reference_id":"r-2""#,
        r#"{"reference":"r-2"}"#,
        r#"{"reference_id":2}"#,
    ] {
        let reply = send("POST", &gateway.url("/payouts/2"), &json, refused).await;
        assert_eq!(reply.status.as_u16(), 400, "{refused}: {:?}", reply.body);
    }
    assert_eq!(provider.calls(), 1, "nothing refused was forwarded");
    // Nothing was recorded for r-2 either: its first well-formed request is a fresh call.
    let fresh = send(
        "POST",
        &gateway.url("/payouts/2"),
        &json,
        r#"{"reference_id":"r-2"}"#,
    )
    .await;
    assert_eq!(fresh.status.as_u16(), 201, "{:?}", fresh.body);
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let order = send(
        "POST",
        &gateway.url("/orders/1"),
        &form,
        "order=o-1&amount=5",
    )
    .await;
    assert_eq!(order.status.as_u16(), 201);
    let twice = send(
        "POST",
        &gateway.url("/orders/1"),
        &form,
        "order=o-1&order=o-2",
    )
    .await;
    assert_eq!(twice.status.as_u16(), 400);
    assert_eq!(provider.charges()[2].key.as_deref(), Some("order:o-1"));
}

/// A client library that writes its own random key into the body (Square's SDKs require one):
/// under `client_key = "replace"` the gateway puts its derived key in that member's place, so
/// two calls for one operation with different client keys reach the provider as one, charged
/// once; under the default for body keys (`refuse`) such a call is a 400, nothing forwarded.
#[tokio::test]
async fn a_clients_own_key_in_the_body_is_replaced_or_refused() {
    let provider = Provider::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let routes = format!(
        "{}{}",
        idempotent_route(
            &provider,
            "payments",
            "pay:{json:/reference_id}",
            "inject = \"json:/idempotency_key\"\nclient_key = \"replace\"",
        ),
        idempotent_route(
            &provider,
            "strict",
            "pay:{json:/reference_id}",
            "inject = \"json:/idempotency_key\"",
        )
    );
    let gateway = Launch::new().start(dir.path(), &routes);
    let json = [("content-type", "application/json")];
    let call = |client_key: &str| {
        format!(r#"{{"reference_id":"r-1", "idempotency_key": "{client_key}", "amount": 1.10}}"#)
    };
    let first = send("POST", &gateway.url("/payments/1"), &json, &call("rand-a")).await;
    assert_eq!(first.status.as_u16(), 201, "{:?}", first.body);
    let second = send("POST", &gateway.url("/payments/1"), &json, &call("rand-b")).await;
    assert_eq!(second.status.as_u16(), 201, "{:?}", second.body);
    assert!(replayed(&second), "the second call is the first's replay");
    let charges = provider.charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(
        String::from_utf8(charges[0].body.to_vec()).unwrap(),
        r#"{"reference_id":"r-1", "idempotency_key": "pay:r-1", "amount": 1.10}"#,
        "the client's key replaced in place, every other byte kept"
    );
    let refused = send("POST", &gateway.url("/strict/1"), &json, &call("rand-c")).await;
    assert_eq!(refused.status.as_u16(), 400, "{:?}", refused.body);
    assert_eq!(refused.problem_slug(), "invalid-resource-key");
    assert_eq!(provider.calls(), 1);
}
