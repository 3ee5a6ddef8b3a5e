//! Reloading routes on `POST /admin/reload` and on SIGHUP, with the real binary: new routes apply
//! to new requests at once, a request in flight finishes on the route it matched, an invalid
//! file keeps the old routes and says why (the endpoint's answer, the log, a metric), and a
//! change a reload cannot apply is named as waiting for a restart.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::gateway::{config_text_with_store, embedded_store, fenced_route};
use crate::support::process::{free_port, stderr_path, Launch};
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream, DELAY_HEADER};

const TOKEN: &str = "reload-test-token-0123456789";

fn write_config(dir: &Path, listen: &str, routes: &str) {
    let text = config_text_with_store(dir, listen, &embedded_store(dir), routes);
    std::fs::write(dir.join("fencegate.toml"), text).unwrap();
}

async fn reload(admin: &str) -> support::Reply {
    let auth = format!("Bearer {TOKEN}");
    send(
        "POST",
        &format!("http://{admin}/admin/reload"),
        &[("authorization", &auth)],
        "",
    )
    .await
}

async fn wait_for(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(url).is_err() {
        assert!(Instant::now() < deadline, "{url} never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_reload_atomically_and_an_invalid_file_changes_nothing() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let admin = free_port().to_string();
    let admin_toml = format!("[admin]\nlisten = \"{admin}\"\ntoken = \"{TOKEN}\"\n");
    let with = |name: &str| {
        format!(
            "{}{admin_toml}",
            fenced_route(name, &upstream.url(), "enforce", "monotonic")
        )
    };
    let process =
        GatewayProcess::start_with_store(dir.path(), &embedded_store(dir.path()), &with("inv"));
    wait_for(&admin).await;
    let listen = process.addr.to_string();

    // A slow write is in flight on the old route while the routes change.
    let slow_url = process.url("/inv/1");
    let slow = tokio::spawn(async move {
        send(
            "PUT",
            &slow_url,
            &[("x-fence", "1"), (DELAY_HEADER, "800")],
            "",
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    write_config(dir.path(), &listen, &with("docs"));
    let answer = reload(&admin).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.json()["routes"], 1);
    assert_eq!(
        send("PUT", &process.url("/docs/1"), &[("x-fence", "1")], "")
            .await
            .status,
        200
    );
    assert_eq!(
        send("PUT", &process.url("/inv/2"), &[("x-fence", "1")], "")
            .await
            .status,
        404,
        "the old route is gone"
    );
    assert_eq!(
        slow.await.unwrap().status,
        200,
        "the in-flight request finished on its old route"
    );

    // An invalid file: the reload is refused with the reason, and the routes stay as they were.
    let broken = with("docs").replace("mode = \"enforce\"", "mode = \"sometimes\"");
    write_config(dir.path(), &listen, &broken);
    let refused = reload(&admin).await;
    assert_eq!(refused.status, 400);
    let error = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        error.contains("fence.mode") && error.contains("\"docs\""),
        "{error}"
    );
    assert_eq!(
        send("PUT", &process.url("/docs/2"), &[("x-fence", "1")], "")
            .await
            .status,
        200
    );
    let metrics = send("GET", &format!("http://{admin}/metrics"), &[], "").await;
    let metrics = String::from_utf8(metrics.body.to_vec()).unwrap();
    assert!(
        metrics.contains("fencegate_config_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("fencegate_config_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );

    // SIGHUP reloads too.
    write_config(dir.path(), &listen, &with("inv"));
    let status = std::process::Command::new("kill")
        .args(["-HUP", &process.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = send("PUT", &process.url("/inv/3"), &[("x-fence", "1")], "").await;
        if reply.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the routes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        send("PUT", &process.url("/docs/3"), &[("x-fence", "1")], "")
            .await
            .status,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_listener_certificate() {
    use crate::support::tls::{https_get, TestCa};
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (TestCa::new("old CA"), TestCa::new("new CA"));
    let names = ["localhost", "127.0.0.1"];
    let (cert, key) = old_ca.leaf(&names).write(dir.path(), "listener");
    let store_toml = format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n{}",
        cert.display(),
        key.display(),
        embedded_store(dir.path())
    );
    let process = GatewayProcess::start_with_store(
        dir.path(),
        &store_toml,
        &fenced_route("inv", &upstream.url(), "enforce", "monotonic"),
    );
    let url = format!("https://localhost:{}/inv/1", process.addr.port());
    assert_eq!(
        https_get(&old_ca.pem, None, &url)
            .await
            .expect("served over TLS")
            .status,
        200
    );

    new_ca.leaf(&names).write(dir.path(), "listener");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &process.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while https_get(&new_ca.pem, None, &url).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the certificate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        https_get(&old_ca.pem, None, &url).await.is_err(),
        "the old certificate is still served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_names_the_restart_only_sections_the_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let process = Launch::new().admin(TOKEN, "").start(dir.path(), "");
    let config = dir.path().join("fencegate.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let changed = text.replacen("shutdown_grace = \"5s\"", "shutdown_grace = \"6s\"", 1);
    assert_ne!(changed, text, "the [server] table changed shape");
    std::fs::write(&config, changed).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &process.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    // The reload applies what it can and names [server], which waits for a restart: in the log
    // (a warning) and in a gauge per section.
    let waiting = "fencegate_reload_restart_required{section=\"server\"} 1";
    let deadline = Instant::now() + Duration::from_secs(10);
    let (warning, metrics) = loop {
        let log = std::fs::read_to_string(stderr_path(dir.path())).unwrap_or_default();
        let warning = log
            .lines()
            .find(|line| line.contains("WARN") && line.contains("restart"))
            .map(str::to_owned);
        let metrics = send("GET", &process.admin_url("/metrics"), &[], "").await;
        let metrics = String::from_utf8(metrics.body.to_vec()).unwrap();
        if warning.is_some() && metrics.contains(waiting) {
            break (warning.unwrap_or_default(), metrics);
        }
        assert!(
            Instant::now() < deadline,
            "no restart warning after SIGHUP; log:\n{log}\nmetrics:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(warning.contains("server"), "{warning}");
    for unchanged in ["store", "admin"] {
        assert!(
            metrics.contains(&format!(
                "fencegate_reload_restart_required{{section=\"{unchanged}\"}} 0"
            )),
            "{unchanged}: {metrics}"
        );
    }
}
