//! The Prometheus exposition as an operator's dashboards and alerts read it: no counter or
//! histogram goes down when routes are reloaded under load (a reload must not look like a
//! restart to `rate()`), answers are counted by route, method and status code and timed to the
//! response head in buckets past the default 30 s route timeout, the process's own metrics and
//! the buffer limit are there, and `promtool check metrics` accepts all of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::admin_api::{metric, AdminApi};
use crate::support::gateway::fenced_route;
use crate::support::promtool::promtool_check;
use crate::support::{send, Behavior, RecordingUpstream, TestGateway};

const TOKEN: &str = "metrics-admin-token-0123456789";

/// The samples of every counter and histogram of an exposition, by series (name and labels as
/// exposed): the values that may only grow while the process lives.
fn monotonic_samples(exposition: &str) -> HashMap<String, f64> {
    let mut families: Vec<(String, bool)> = Vec::new();
    let mut samples = HashMap::new();
    for line in exposition.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split_whitespace();
            if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                families.push((name.to_owned(), kind == "histogram"));
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        let monotonic = families.iter().any(|(family, histogram)| {
            let counter = !histogram && name == family && name.ends_with("_total");
            let histogram = *histogram
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| name.strip_suffix(suffix) == Some(family.as_str()));
            counter || histogram
        });
        if monotonic {
            let value: f64 = value.parse().unwrap_or(f64::NAN);
            samples.insert(series.to_owned(), value);
        }
    }
    samples
}

/// Every series of `before` that is missing from `after` or lower there.
fn went_down(before: &HashMap<String, f64>, after: &HashMap<String, f64>) -> Vec<String> {
    let mut down: Vec<String> = before
        .iter()
        .filter_map(|(series, was)| match after.get(series) {
            None => Some(format!("{series}: {was} -> gone")),
            Some(now) if now < was => Some(format!("{series}: {was} -> {now}")),
            Some(_) => None,
        })
        .collect();
    down.sort();
    down
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_counter_goes_down_when_routes_are_reloaded_under_load() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let inv = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let gw = TestGateway::builder(&inv)
        .admin(TOKEN)
        .config_file()
        .start()
        .await;
    let admin = AdminApi::of(&gw, TOKEN);
    let file = gw.dir.join("fencegate.toml");
    let original = std::fs::read_to_string(&file).expect("the gateway's configuration file");
    let docs = fenced_route("docs", &upstream.url(), "enforce", "monotonic");
    let with_docs = original.replacen(&inv, &format!("{inv}{docs}"), 1);
    assert_ne!(with_docs, original, "the route template changed");

    // Four clients: accepted writes raising their key's mark, stale ones refused, reads, and
    // requests no route matches.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..4u64)
        .map(|client| {
            let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
            let url = |path: &str| gw.url(path);
            let (key_url, other_url) = (url(&format!("/inv/{client}")), url("/nowhere"));
            tokio::spawn(async move {
                let mut token = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    token += 1;
                    let fresh = token.to_string();
                    send("PUT", &key_url, &[("x-fence", &fresh)], "").await;
                    send("PUT", &key_url, &[("x-fence", "1")], "").await;
                    send("GET", &key_url, &[], "").await;
                    send("GET", &other_url, &[], "").await;
                    sent.fetch_add(4, Ordering::Relaxed);
                }
            })
        })
        .collect();

    let mut before = monotonic_samples(&admin.metrics().await);
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let text = if round % 2 == 0 {
            &with_docs
        } else {
            &original
        };
        std::fs::write(&file, text).expect("write the configuration");
        let reloaded = admin.reload().await;
        assert_eq!(reloaded.status, 200, "{:?}", reloaded.body);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let after = monotonic_samples(&admin.metrics().await);
        // `docs` comes and goes; its series stay, frozen while it is away.
        let down = went_down(&before, &after);
        assert!(
            down.is_empty(),
            "reload {round} reset these series:\n{}",
            down.join("\n")
        );
        before = after;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("a client task");
    }

    let exposition = admin.metrics().await;
    let stale = metric(
        &exposition,
        "fencegate_fence_rejections_total{reason=\"stale\",route=\"inv\"}",
    )
    .expect("stale refusals of inv");
    assert!(
        stale >= 4.0,
        "the load was refused as stale across the reloads: {stale} of {} requests",
        sent.load(Ordering::Relaxed)
    );
    assert_eq!(
        metric(&exposition, "fencegate_config_reloads_total{result=\"ok\"}"),
        Some(6.0)
    );
    gw.stop().await;
}

/// A gateway with the fenced route `inv` (and a 3 MiB buffer budget) in front of an upstream
/// that answers 200, with an admin listener; the upstream must live as long as the gateway.
async fn fenced_inv() -> (RecordingUpstream, TestGateway) {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let gw = TestGateway::builder(&route)
        .admin(TOKEN)
        .server_options("max_buffered_bytes = \"3MiB\"")
        .start()
        .await;
    (upstream, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_counted_by_method_and_code_and_timed() {
    let (_upstream, gw) = fenced_inv().await;
    let admin = AdminApi::of(&gw, TOKEN);
    assert_eq!(
        send("PUT", &gw.url("/inv/1"), &[("x-fence", "5")], "")
            .await
            .status,
        200
    );
    assert_eq!(
        send("PUT", &gw.url("/inv/1"), &[("x-fence", "4")], "")
            .await
            .status,
        409
    );
    assert_eq!(send("GET", &gw.url("/inv/1"), &[], "").await.status, 200);
    assert_eq!(
        send("DELETE", &gw.url("/nowhere"), &[], "").await.status,
        404
    );

    let exposition = admin.metrics().await;
    for (series, count) in [
        ("{code=\"200\",method=\"PUT\",route=\"inv\"}", 1.0),
        ("{code=\"409\",method=\"PUT\",route=\"inv\"}", 1.0),
        ("{code=\"200\",method=\"GET\",route=\"inv\"}", 1.0),
        ("{code=\"404\",method=\"DELETE\",route=\"_none\"}", 1.0),
    ] {
        assert_eq!(
            metric(&exposition, &format!("fencegate_responses_total{series}")),
            Some(count),
            "{series}"
        );
    }
    assert_eq!(
        metric(
            &exposition,
            "fencegate_request_duration_seconds_count{route=\"inv\"}"
        ),
        Some(3.0)
    );
    // A request that ran into the default 30 s route timeout has a bucket of its own.
    assert_eq!(
        metric(
            &exposition,
            "fencegate_request_duration_seconds_bucket{route=\"inv\",le=\"60\"}"
        ),
        Some(3.0)
    );
    assert_eq!(
        metric(&exposition, "fencegate_buffered_body_bytes_limit"),
        Some(3.0 * 1024.0 * 1024.0)
    );
    // The crate's process collector counts CPU in whole seconds: a test process may show 0.
    assert!(metric(&exposition, "process_cpu_seconds_total").is_some());
    for process in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            metric(&exposition, process).is_some_and(|value| value > 0.0),
            "{process} in:\n{exposition}"
        );
    }
    promtool_check(&exposition);
    gw.stop().await;
}

/// `deploy/prometheus/metric-names.txt`, against which the alerting rules and the dashboard are
/// checked (`scripts/check-prometheus-rules.sh`), is exactly what the gateway can export: every
/// family a running gateway exposes is listed, and every listed `fencegate_` name is one the
/// registry in `src/metrics.rs` declares (some appear only with TLS, an authority or intents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metric_names_the_alerts_are_checked_against_are_the_exported_ones() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let listed: Vec<String> =
        std::fs::read_to_string(root.join("deploy/prometheus/metric-names.txt"))
            .expect("deploy/prometheus/metric-names.txt")
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(str::to_owned)
            .collect();
    let source = std::fs::read_to_string(root.join("src/metrics.rs")).expect("src/metrics.rs");
    let declared: Vec<&str> = source
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|text| {
            text.starts_with("fencegate_")
                && text.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                && *text != "fencegate_detached_total"
        })
        .collect();
    for name in &declared {
        assert!(listed.iter().any(|l| l == name), "{name} is not listed");
    }
    for name in listed.iter().filter(|name| name.starts_with("fencegate_")) {
        assert!(
            declared.contains(&name.as_str()),
            "{name} is listed but src/metrics.rs declares no such metric"
        );
    }

    let (_upstream, gw) = fenced_inv().await;
    send("PUT", &gw.url("/inv/1"), &[("x-fence", "1")], "").await;
    let exposition = AdminApi::of(&gw, TOKEN).metrics().await;
    let families: Vec<&str> = exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|declared| declared.split_whitespace().next())
        .collect();
    assert!(families.len() > 20, "{exposition}");
    for family in families {
        assert!(
            listed.iter().any(|l| l == family),
            "{family} is exported but not in deploy/prometheus/metric-names.txt"
        );
    }
    gw.stop().await;
}
