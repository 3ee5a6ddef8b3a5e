//! `GET /admin/routes`: every route as it is in force — its path as configured, the methods it
//! fences, its upstream and resource key, and its effective fence and idempotency settings, enums
//! spelled as in the configuration file and defaults filled in.

use serde_json::{json, Value};

use crate::support::admin_api::AdminApi;
use crate::support::{Behavior, RecordingUpstream, TestGateway};

const TOKEN: &str = "routes-admin-token-0123456789";

/// The route named `name` in a `/admin/routes` answer.
fn route<'a>(answer: &'a Value, name: &str) -> &'a Value {
    answer["routes"]
        .as_array()
        .expect("a routes array")
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("route {name} is listed: {answer}"))
}

#[tokio::test]
async fn routes_are_described_as_configured_with_defaults_filled_in() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let url = upstream.url();
    // Every fence setting away from its default on `invoices`; all defaults on `payouts`.
    let routes = format!(
        r#"[[routes]]
name = "invoices"
path = "/invoices/{{id}}"
methods = ["PUT", "DELETE"]
upstream = "{url}/api/"
resource_key = "invoice:{{id}}"

[routes.fence]
mode = "observe"
compare = "strict"
ordering = "none"
on_store_error = "fail_open"

[[routes]]
name = "payouts"
path = "/v1/Payouts/{{id}}"
upstream = "{url}"
resource_key = "payout:{{id}}"

[routes.idempotency]
key = "payout:{{id}}"
on_unknown_outcome = "hold"

[[routes]]
name = "refunds"
path = "/refunds/{{id}}"
upstream = "{url}"
resource_key = "refund:{{id}}"

[routes.fence]
ordering = "serialize"
on_store_error = "fail_closed"

[routes.idempotency]
key = "refund:{{id}}:{{header:x-tenant}}"

[[routes]]
name = "static"
path = "/static/{{*rest}}"
upstream = "{url}"

[routes.fence]
mode = "off"
"#
    );
    let gw = TestGateway::builder(&routes).admin(TOKEN).start().await;
    let admin = AdminApi::of(&gw, TOKEN);
    let reply = admin.get("/admin/routes").await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let answer = reply.json();
    let names: Vec<_> = answer["routes"]
        .as_array()
        .expect("a routes array")
        .iter()
        .map(|r| r["name"].clone())
        .collect();
    assert_eq!(names, ["invoices", "payouts", "refunds", "static"]);

    let invoices = route(&answer, "invoices");
    assert_eq!(invoices["path"], "/invoices/{id}");
    assert_eq!(invoices["fenced_methods"], json!(["PUT", "DELETE"]));
    assert_eq!(
        invoices["upstream"],
        format!("{url}/api"),
        "the base URL less its trailing slash"
    );
    assert_eq!(invoices["resource_key"], "invoice:{id}");
    let fence = &invoices["fence"];
    assert_eq!(
        (
            &fence["mode"],
            &fence["compare"],
            &fence["ordering"],
            &fence["on_store_error"]
        ),
        (
            &json!("observe"),
            &json!("strict"),
            &json!("none"),
            &json!("fail_open")
        )
    );
    assert_eq!(fence["authority"], Value::Null);
    assert_eq!(invoices["idempotency"], Value::Null);

    let payouts = route(&answer, "payouts");
    assert_eq!(
        payouts["path"], "/v1/Payouts/{id}",
        "the literal's letter case as configured"
    );
    assert_eq!(
        payouts["fenced_methods"],
        json!(["*", "!GET", "!HEAD", "!OPTIONS", "!TRACE"]),
        "every method but the safe ones"
    );
    assert_eq!(payouts["upstream"], url);
    assert_eq!(payouts["resource_key"], "payout:{id}");
    let fence = &payouts["fence"];
    assert_eq!(
        (
            &fence["mode"],
            &fence["compare"],
            &fence["ordering"],
            &fence["on_store_error"]
        ),
        (
            &json!("enforce"),
            &json!("monotonic"),
            &json!("serialize"),
            &json!("fail_closed")
        ),
        "the defaults, spelled as the file spells them"
    );
    let idempotency = &payouts["idempotency"];
    assert!(idempotency.is_object(), "{payouts}");
    assert_eq!(idempotency["key"], "payout:{id}");
    assert_eq!(idempotency["on_unknown_outcome"], "hold");
    assert_eq!(idempotency["client_key"], "replace");

    let refunds = route(&answer, "refunds");
    assert_eq!(refunds["fence"]["ordering"], "serialize");
    assert_eq!(refunds["fence"]["on_store_error"], "fail_closed");
    assert_eq!(
        refunds["idempotency"]["key"],
        "refund:{id}:{header:x-tenant}"
    );
    assert_eq!(
        refunds["idempotency"]["on_unknown_outcome"], "resubmit",
        "the default"
    );

    let unfenced = route(&answer, "static");
    assert_eq!(unfenced["path"], "/static/{*rest}");
    assert_eq!(unfenced["resource_key"], Value::Null);
    assert_eq!(unfenced["fence"]["mode"], "off");
    assert_eq!(unfenced["idempotency"], Value::Null);
    gw.stop().await;
}
