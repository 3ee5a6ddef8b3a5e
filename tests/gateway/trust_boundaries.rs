//! Headers the gateway sets for the upstream cannot be forged by a client: `Forwarded` and
//! `X-Forwarded-*` (unless the route trusts them), the idempotency key (unless the route keeps
//! the client's by design), and a client cannot make the gateway drop them either by naming them
//! in `Connection`. Admin-endpoint authentication is in `admin.rs`.

use crate::support::upstream::{Behavior, RecordingUpstream};
use crate::support::{send, TestGateway};

fn fenced(upstream: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"inv\"\npath = \"/inv/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"inv:{{id}}\"\n{extra}\n"
    )
}

const FORGED: [(&str, &str); 5] = [
    ("x-fence", "1"),
    ("forwarded", "for=6.6.6.6;proto=https"),
    ("x-forwarded-for", "6.6.6.6"),
    ("x-forwarded-host", "bank.example"),
    ("x-forwarded-proto", "https"),
];

#[tokio::test]
async fn forwarding_headers_from_a_client_are_replaced_by_the_gateways_own() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&fenced(&upstream.url(), "")).await;
    // Also try to make the gateway strip its own values at the proxy.
    let mut headers = FORGED.to_vec();
    headers.push(("connection", "Forwarded, X-Forwarded-For"));
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &headers, "").await.status,
        200
    );
    let seen = &upstream.seen()[0];
    let host = gw.addr.to_string();
    assert_eq!(
        seen.header("forwarded"),
        Some(format!("for=127.0.0.1;host=\"{host}\";proto=http").as_str())
    );
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(seen.header("x-forwarded-host"), Some(host.as_str()));
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    for (name, value) in seen.headers.iter() {
        let value = value.to_str().unwrap_or_default();
        assert!(
            !value.contains("6.6.6.6") && !value.contains("bank.example"),
            "{name}: {value}"
        );
    }
}

#[tokio::test]
async fn a_route_behind_a_trusted_proxy_appends_to_forwarding_headers() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&fenced(&upstream.url(), "trust_forwarded = true")).await;
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &FORGED, "").await.status,
        200
    );
    let seen = &upstream.seen()[0];
    assert_eq!(seen.header("x-forwarded-for"), Some("6.6.6.6, 127.0.0.1"));
    assert!(seen
        .header("forwarded")
        .is_some_and(|v| v.starts_with("for=6.6.6.6;proto=https, for=127.0.0.1")));
}

fn idempotent(upstream: &str, client_key: &str) -> String {
    fenced(
        upstream,
        &format!("\n[routes.idempotency]\nkey = \"inv:{{id}}\"\nclient_key = \"{client_key}\"\n"),
    )
}

#[tokio::test]
async fn a_client_cannot_choose_or_remove_the_idempotency_key_when_the_route_replaces_it() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&idempotent(&upstream.url(), "replace")).await;
    let forged = [
        ("x-fence", "1"),
        ("idempotency-key", "someone-elses-key"),
        ("idempotency-key", "second-value"),
    ];
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &forged, "a").await.status,
        200
    );
    // Naming the header in `Connection` must not make the gateway drop the key it sets.
    let dropping = [
        ("x-fence", "1"),
        ("connection", "Idempotency-Key"),
        ("idempotency-key", "x"),
    ];
    assert_eq!(
        send("POST", &gw.url("/inv/2"), &dropping, "b").await.status,
        200
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    for (seen, id) in seen.iter().zip(["1", "2"]) {
        let keys: Vec<_> = seen.headers.get_all("idempotency-key").iter().collect();
        assert_eq!(keys, [format!("inv:{id}").as_str()], "{}", seen.target);
    }
}

#[tokio::test]
async fn a_route_that_keeps_client_keys_forwards_the_clients_key_by_design() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&idempotent(&upstream.url(), "keep")).await;
    let headers = [("x-fence", "1"), ("idempotency-key", "client-chosen")];
    assert_eq!(
        send("POST", &gw.url("/inv/1"), &headers, "a").await.status,
        200
    );
    assert_eq!(
        upstream.seen()[0].header("idempotency-key"),
        Some("client-chosen")
    );
}

#[tokio::test]
async fn naming_the_request_id_in_connection_does_not_remove_it() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = TestGateway::start(&fenced(&upstream.url(), "")).await;
    let headers = [("x-fence", "1"), ("connection", "X-Request-Id")];
    let reply = send("POST", &gw.url("/inv/1"), &headers, "").await;
    assert_eq!(reply.status, 200);
    let id = reply.header("x-request-id").expect("answered with an id");
    assert_eq!(upstream.seen()[0].header("x-request-id"), Some(id));
}
