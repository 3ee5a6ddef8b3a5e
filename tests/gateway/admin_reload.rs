//! `POST /admin/reload` on a gateway started from a configuration file: the routes are applied at
//! once, and the sections only a restart applies (`[server]`, `[store]`, `[admin]`,
//! `[telemetry]`) are named when the file changes them since the gateway started — in the answer's
//! `restart_required` and in the gauge `fencegate_reload_restart_required{section}` — until the file
//! spells them as at the start again.

use std::path::Path;

use serde_json::json;

use crate::support::admin_api::{metric, AdminApi};
use crate::support::gateway::fenced_route;
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

const TOKEN: &str = "reload-admin-token-0123456789";

/// Writes `text` to the gateway's configuration file and reloads it; the answer, which must be 200.
async fn reload_with(admin: &AdminApi, file: &Path, text: &str) -> serde_json::Value {
    std::fs::write(file, text).expect("write the configuration");
    let reply = admin.reload().await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["reloaded"], true);
    answer
}

/// The gauge `fencegate_reload_restart_required` of `[server]`, `[store]`, `[admin]` and
/// `[telemetry]`.
async fn restart_gauges(admin: &AdminApi) -> [Option<f64>; 4] {
    let exposition = admin.metrics().await;
    ["server", "store", "admin", "telemetry"].map(|section| {
        metric(
            &exposition,
            &format!("fencegate_reload_restart_required{{section=\"{section}\"}}"),
        )
    })
}

/// The status of a fenced write of `path`.
async fn write_status(gw: &TestGateway, path: &str) -> u16 {
    send("PUT", &gw.url(path), &[("x-fence", "1")], "")
        .await
        .status
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_names_the_sections_only_a_restart_applies() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = |name: &str| fenced_route(name, &upstream.url(), "enforce", "monotonic");
    let gw = TestGateway::builder(&route("inv"))
        .admin(TOKEN)
        .config_file()
        .start()
        .await;
    let admin = AdminApi::of(&gw, TOKEN);
    let file = gw.dir.join("fencegate.toml");
    let original = std::fs::read_to_string(&file).expect("the gateway's configuration file");
    assert!(original.contains(&route("inv")) && original.contains("[server]\n"));
    let with_routes = |text: &str, routes: &str| text.replacen(&route("inv"), routes, 1);
    let server_changed = original.replacen("[server]\n", "[server]\nidle_timeout = \"61s\"\n", 1);

    // `[server]` changed and the route replaced: the route applies, the server waits.
    let answer = reload_with(&admin, &file, &with_routes(&server_changed, &route("docs"))).await;
    assert_eq!(answer["restart_required"], json!(["server"]));
    assert_eq!(answer["routes"], 1);
    assert_eq!(
        write_status(&gw, "/docs/1").await,
        200,
        "the new route is in force"
    );
    assert_eq!(
        write_status(&gw, "/inv/1").await,
        404,
        "the old one is gone"
    );
    assert_eq!(
        restart_gauges(&admin).await,
        [Some(1.0), Some(0.0), Some(0.0), Some(0.0)]
    );

    // Compared with the start, not with the last reload: the same file still waits for a restart.
    let answer = reload_with(&admin, &file, &with_routes(&server_changed, &route("docs"))).await;
    assert_eq!(answer["restart_required"], json!(["server"]));

    // `[admin]` too, named in the sections' order; the running listener keeps its settings.
    let both_changed = with_routes(&server_changed, &route("docs")).replacen(
        &format!("token = \"{TOKEN}\"\n"),
        &format!("token = \"{TOKEN}\"\nprobes_require_token = true\n"),
        1,
    );
    let answer = reload_with(&admin, &file, &both_changed).await;
    assert_eq!(answer["restart_required"], json!(["server", "admin"]));
    assert_eq!(
        restart_gauges(&admin).await,
        [Some(1.0), Some(0.0), Some(1.0), Some(0.0)]
    );
    let probe = send("GET", &gw.admin_url("/metrics"), &[], "").await;
    assert_eq!(probe.status, 200, "the [admin] change waits for a restart");

    // An invalid file: refused, and nothing it says is applied or reported.
    std::fs::write(
        &file,
        both_changed.replacen("[server]\n", "[server]\nlisten = ", 1),
    )
    .unwrap();
    let refused = admin.reload().await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.problem_slug(), "invalid-config");
    assert_eq!(write_status(&gw, "/docs/1").await, 200);
    assert_eq!(
        restart_gauges(&admin).await,
        [Some(1.0), Some(0.0), Some(1.0), Some(0.0)]
    );

    // `[store]` and a new `[telemetry]` instead, `[server]` and `[admin]` as at the start.
    let store_changed = with_routes(&original, &route("docs")).replacen(
        "[store]\n",
        "[store]\ncache_capacity = 1000\n",
        1,
    ) + "\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:9\"\n";
    let answer = reload_with(&admin, &file, &store_changed).await;
    assert_eq!(answer["restart_required"], json!(["store", "telemetry"]));
    assert_eq!(
        restart_gauges(&admin).await,
        [Some(0.0), Some(1.0), Some(0.0), Some(1.0)]
    );

    // The restart-only sections as at the start again: nothing waits.
    let answer = reload_with(&admin, &file, &with_routes(&original, &route("docs"))).await;
    assert_eq!(answer["restart_required"], json!([]));
    assert_eq!(
        restart_gauges(&admin).await,
        [Some(0.0), Some(0.0), Some(0.0), Some(0.0)]
    );

    // Only routes change (and a comment in `[server]`, which changes no setting).
    let routes_only = with_routes(&original, &format!("{}{}", route("docs"), route("inv")))
        .replacen("[server]\n", "[server]\n# reformatted by hand\n", 1);
    let answer = reload_with(&admin, &file, &routes_only).await;
    assert_eq!(answer["restart_required"], json!([]));
    assert_eq!(answer["routes"], 2);
    assert_eq!(write_status(&gw, "/inv/2").await, 200);
    assert_eq!(write_status(&gw, "/docs/2").await, 200);
    assert_eq!(
        restart_gauges(&admin).await,
        [Some(0.0), Some(0.0), Some(0.0), Some(0.0)]
    );
    gw.stop().await;
}
