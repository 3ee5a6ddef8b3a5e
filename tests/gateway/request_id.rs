//! `X-Request-Id`: a sane client id is kept, anything else is replaced by a UUID, and the same id
//! reaches the upstream and comes back on every response, problem responses included.

use crate::support::gateway::fenced_route;
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

async fn gateway(upstream: &RecordingUpstream) -> TestGateway {
    TestGateway::start(&fenced_route(
        "docs",
        &upstream.url(),
        "enforce",
        "monotonic",
    ))
    .await
}

fn assert_is_uuid(id: &str) {
    assert!(
        uuid::Uuid::parse_str(id).is_ok(),
        "{id:?} is not a generated UUID"
    );
}

#[tokio::test]
async fn client_request_id_is_passed_upstream_and_returned() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let reply = send(
        "PUT",
        &gw.url("/docs/1"),
        &[("x-fence", "1"), ("x-request-id", "client-42.a_b")],
        "x",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-request-id"), Some("client-42.a_b"));
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-request-id"), Some("client-42.a_b"));
}

#[tokio::test]
async fn request_id_is_generated_when_absent_and_is_the_same_upstream_and_in_the_response() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let reply = send("PUT", &gw.url("/docs/1"), &[("x-fence", "1")], "x").await;
    assert_eq!(reply.status, 200);
    let returned = reply
        .header("x-request-id")
        .expect("a request id is returned");
    assert_is_uuid(returned);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-request-id"), Some(returned));

    let again = send("PUT", &gw.url("/docs/1"), &[("x-fence", "1")], "x").await;
    assert_ne!(
        again.header("x-request-id"),
        Some(returned),
        "each request gets its own id"
    );
}

#[tokio::test]
async fn request_id_is_returned_on_the_gateways_problem_responses() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let accepted = send("PUT", &gw.url("/docs/1"), &[("x-fence", "5")], "x").await;
    assert_eq!(accepted.status, 200);

    let stale = send(
        "PUT",
        &gw.url("/docs/1"),
        &[("x-fence", "3"), ("x-request-id", "stale-writer-1")],
        "x",
    )
    .await;
    assert_eq!(stale.status, 409);
    assert_eq!(stale.problem_slug(), "stale-fence");
    assert_eq!(stale.header("x-request-id"), Some("stale-writer-1"));

    let no_route = send("GET", &gw.url("/nowhere"), &[], "").await;
    assert_eq!(no_route.status, 404);
    assert_is_uuid(no_route.header("x-request-id").expect("404 carries an id"));

    let reserved = send(
        "GET",
        &gw.url("/_fencegate/nothing-here"),
        &[("x-request-id", "reserved-1")],
        "",
    )
    .await;
    assert!(reserved.status.is_client_error(), "{}", reserved.status);
    assert_eq!(reserved.header("x-request-id"), Some("reserved-1"));
    assert_eq!(upstream.seen().len(), 1, "refusals are not forwarded");
}

#[tokio::test]
async fn insane_client_request_ids_are_replaced() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let too_long = "a".repeat(129);
    let insane = [too_long.as_str(), "has space", "tab\there", "café"];
    for (i, value) in insane.iter().enumerate() {
        let reply = send(
            "PUT",
            &gw.url(&format!("/docs/{i}")),
            &[("x-fence", "1"), ("x-request-id", value)],
            "x",
        )
        .await;
        assert_eq!(reply.status, 200, "{value:?}");
        let returned = reply.header("x-request-id").expect("an id is returned");
        assert_is_uuid(returned);
        let seen = upstream.seen_under(&format!("/docs/{i}"));
        assert_eq!(seen.len(), 1, "{value:?}");
        let forwarded: Vec<_> = seen[0].headers.get_all("x-request-id").iter().collect();
        assert_eq!(forwarded, [returned], "only the replacement is forwarded");
    }
    // The longest kept id is exactly 128 bytes.
    let longest = "b".repeat(128);
    let reply = send(
        "PUT",
        &gw.url("/docs/longest"),
        &[("x-fence", "1"), ("x-request-id", &longest)],
        "x",
    )
    .await;
    assert_eq!(reply.header("x-request-id"), Some(longest.as_str()));
}
