//! Every failure of the admin API is a problem document (RFC 9457, `application/problem+json`)
//! whose `type` names the kind and whose `status` is the response's: unknown endpoints and
//! methods, missing tokens, malformed bodies and queries, a reload with no file to read.

use crate::support::admin_api::AdminApi;
use crate::support::gateway::fenced_route;
use crate::support::{send, Behavior, RecordingUpstream, Reply, TestGateway};

const TOKEN: &str = "problems-admin-token-0123456789";

/// Asserts that `reply` is the problem `slug` with HTTP `status`, and says which call it was.
fn assert_problem(reply: &Reply, status: u16, slug: &str, call: &str) {
    assert_eq!(reply.status, status, "{call}: {:?}", reply.body);
    assert_eq!(reply.problem_slug(), slug, "{call}");
    assert_eq!(reply.json()["status"], status, "{call}");
}

#[tokio::test]
async fn every_admin_failure_is_a_problem_document() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    // Not started from a file: a reload has nothing to re-read.
    let gw = TestGateway::builder(&route).admin(TOKEN).start().await;
    let admin = AdminApi::of(&gw, TOKEN);

    for path in ["/admin/nope", "/admin", "/nope", "/admin/routes/inv"] {
        let reply = admin.get(path).await;
        assert_problem(&reply, 404, "no-such-endpoint", path);
    }

    // 405 names the methods the endpoint takes (RFC 9110 §15.5.6).
    let wrong_methods = [
        ("DELETE", "/admin/routes", "GET"),
        ("POST", "/admin/routes", "GET"),
        ("DELETE", "/admin/fences/inv:1", "PUT"),
        ("POST", "/admin/intents", "GET"),
        ("PUT", "/admin/intents/payouts%2Fpayout:1", "GET"),
        ("GET", "/admin/intents/payouts%2Fpayout:1/resolve", "POST"),
        ("GET", "/admin/reload", "POST"),
        ("DELETE", "/metrics", "GET"),
    ];
    for (method, path, allowed) in wrong_methods {
        let reply = admin.call(method, path, "").await;
        let call = format!("{method} {path}");
        assert_problem(&reply, 405, "method-not-allowed", &call);
        let allow = reply.header("allow").unwrap_or_default();
        assert!(
            allow.split(',').any(|m| m.trim() == allowed),
            "{call}: Allow {allow:?} lacks {allowed}"
        );
    }

    let bad_fences = [
        "",
        "not JSON",
        "{}",
        r#"{"fence": "7"}"#,
        r#"{"fence": -1}"#,
        r#"{"fence": 1.5}"#,
        r#"{"fence": 7, "extra": 1}"#,
    ];
    for body in bad_fences {
        let reply = admin.call("PUT", "/admin/fences/k", body).await;
        assert_problem(
            &reply,
            400,
            "invalid-body",
            &format!("PUT /admin/fences/k {body}"),
        );
    }
    // A key that does not decode to UTF-8, or longer than any resource key, is a problem
    // document too, not axum's plain-text rejection.
    let long_key = "k".repeat(513);
    for (method, path) in [
        ("GET", "/admin/fences/%FF".to_owned()),
        ("PUT", "/admin/fences/%C3%28".to_owned()),
        ("GET", "/admin/intents/%FF".to_owned()),
        ("POST", "/admin/intents/%C3%28/resolve".to_owned()),
        ("GET", format!("/admin/fences/{long_key}")),
        ("GET", format!("/admin/intents/{}", "k".repeat(1025))),
    ] {
        let reply = admin.call(method, &path, r#"{"fence": 1}"#).await;
        assert_problem(
            &reply,
            400,
            "invalid-key",
            &format!("{method} {}", &path[..path.len().min(40)]),
        );
    }
    let longest = admin
        .call(
            "PUT",
            &format!("/admin/fences/{}", "k".repeat(512)),
            r#"{"fence": 1}"#,
        )
        .await;
    assert_eq!(longest.status, 200, "a 512-character key is a resource key");

    let unread = admin.get("/admin/fences/k").await;
    assert_problem(&unread, 404, "no-mark", "a refused body raised no mark");
    assert_eq!(unread.json()["key"], "k");

    for query in [
        "older_than=soon",
        "colour=red",
        "state=completed",
        "limit=-1",
    ] {
        let path = format!("/admin/intents?{query}");
        assert_problem(&admin.get(&path).await, 400, "invalid-query", &path);
    }

    let reload = admin.reload().await;
    assert_problem(
        &reload,
        400,
        "invalid-config",
        "POST /admin/reload without a file",
    );

    let anonymous = send("GET", &gw.admin_url("/admin/routes"), &[], "").await;
    assert_problem(
        &anonymous,
        401,
        "unauthorized",
        "GET /admin/routes without a token",
    );
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    let wrong = send(
        "POST",
        &gw.admin_url("/admin/intents/payouts%2Fpayout:1/resolve"),
        &[("authorization", "Bearer wrong")],
        r#"{"release": true}"#,
    )
    .await;
    assert_problem(&wrong, 401, "unauthorized", "resolve with a wrong token");
    assert_eq!(wrong.header("www-authenticate"), Some("Bearer"));
    gw.stop().await;
}
