//! Claiming (docs/design.md §5): a new holder raises its key's mark without writing, so a zombie's
//! write that would land before the holder's first write is refused; nothing is ever forwarded.

use crate::support::gateway::fenced_route;
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

/// A fenced `invoices` route plus a catch-all plain route (which must not catch `/_fencegate/`).
async fn gateway(upstream: &RecordingUpstream) -> TestGateway {
    let routes = format!(
        "{}[[routes]]\nname = \"rest\"\npath = \"/{{*rest}}\"\nupstream = \"{}\"\n[routes.fence]\nmode = \"off\"\n",
        fenced_route("invoices", &upstream.url(), "enforce", "monotonic"),
        upstream.url()
    );
    TestGateway::start(&routes).await
}

#[tokio::test]
async fn claim_then_a_write_below_the_claimed_token_is_refused() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let claim = send(
        "POST",
        &gw.url("/_fencegate/claim/invoices:72"),
        &[("x-fence", "34")],
        "",
    )
    .await;
    assert_eq!(claim.status, 200);
    assert_eq!(claim.header("content-type"), Some("application/json"));
    assert_eq!(
        claim.json(),
        serde_json::json!({"key": "invoices:72", "fence": 34, "previous": null})
    );
    // The old holder (token 33) wakes up and writes: refused although the new holder never wrote.
    let zombie = send(
        "POST",
        &gw.url("/invoices/72"),
        &[("x-fence", "33")],
        "late",
    )
    .await;
    assert_eq!(zombie.status, 409);
    assert_eq!(zombie.header("x-fence-current"), Some("34"));
    // The new holder writes with its own token.
    let holder = send(
        "POST",
        &gw.url("/invoices/72"),
        &[("x-fence", "34")],
        "fresh",
    )
    .await;
    assert_eq!(holder.status, 200);
    let seen = upstream.seen();
    assert_eq!(
        seen.len(),
        1,
        "the claim and the zombie's write never reached the upstream"
    );
    assert_eq!(seen[0].fence(), Some(34));
}

#[tokio::test]
async fn claim_reports_the_previous_mark_and_refuses_stale_claims() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let url = gw.url("/_fencegate/claim/invoices:9");
    assert_eq!(
        send("POST", &url, &[("x-fence", "5")], "").await.status,
        200
    );
    let next = send("POST", &url, &[("x-fence", "6")], "").await;
    assert_eq!(next.json()["previous"], 5);
    let again = send("POST", &url, &[("x-fence", "6")], "").await;
    assert_eq!(again.status, 200, "re-claiming one's own token is allowed");
    let stale = send("POST", &url, &[("x-fence", "5")], "").await;
    assert_eq!(stale.status, 409);
    assert_eq!(stale.problem_slug(), "stale-fence");
    assert_eq!(stale.json()["current_fence"], 6);
    assert_eq!(stale.header("x-fence-current"), Some("6"));
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn claim_checks_its_token_like_a_write() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let url = gw.url("/_fencegate/claim/k");
    assert_eq!(send("POST", &url, &[], "").await.status, 428);
    assert_eq!(
        send("POST", &url, &[("x-fence", "1.5")], "").await.status,
        400
    );
    assert_eq!(
        send("POST", &url, &[("x-fence", "1"), ("x-fence", "2")], "")
            .await
            .status,
        400
    );
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn claim_keys_are_percent_decoded() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let claim = send(
        "POST",
        &gw.url("/_fencegate/claim/invoices%3A5"),
        &[("x-fence", "3")],
        "",
    )
    .await;
    assert_eq!(claim.json()["key"], "invoices:5");
    let zombie = send("POST", &gw.url("/invoices/5"), &[("x-fence", "2")], "").await;
    assert_eq!(zombie.status, 409);
}

#[tokio::test]
async fn the_reserved_prefix_is_never_routed_upstream() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let gw = gateway(&upstream).await;
    let wrong_method = send(
        "GET",
        &gw.url("/_fencegate/claim/k"),
        &[("x-fence", "1")],
        "",
    )
    .await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.header("allow"), Some("POST"));
    let unknown = send("POST", &gw.url("/_fencegate/other"), &[], "").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.problem_slug(), "no-route");
    let empty_key = send(
        "POST",
        &gw.url("/_fencegate/claim/"),
        &[("x-fence", "1")],
        "",
    )
    .await;
    assert_eq!(empty_key.status, 400);
    // The catch-all route does serve everything else.
    assert_eq!(send("GET", &gw.url("/anything"), &[], "").await.status, 200);
    assert_eq!(upstream.seen().len(), 1);
}

#[tokio::test]
async fn routes_under_the_reserved_prefix_are_rejected_at_load() {
    let text = "[server]\nlisten = \"127.0.0.1:0\"\n[[routes]]\nname = \"sneaky\"\npath = \"/_fencegate/claim/{id}\"\nupstream = \"http://127.0.0.1:1\"\nresource_key = \"k:{id}\"\n";
    let error = fencegate::Compiled::parse(text, std::path::Path::new("x.toml")).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("sneaky") && message.contains("path") && message.contains("reserved"),
        "{message}"
    );
}
