//! What the real binary tells operators about each request: the access log (one JSON line per
//! request, with the record the layers filled, sampled as configured) and trace context (the
//! client's `traceparent` forwarded untouched without `[telemetry]`; with it, a server span per
//! request exported over OTLP/HTTP to a receiver this test runs, and that span as the parent
//! the upstream sees).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use crate::support::gateway::fenced_route;
use crate::support::process::{stderr_path, Launch};
use crate::support::{send, Behavior, RecordingUpstream, DELAY_HEADER};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn client_traceparent() -> String {
    format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")
}

/// The access lines (target `fencegate::access`) of a JSON log.
fn access_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["target"] == "fencegate::access")
        .collect()
}

/// Stops the gateway and returns its stderr.
async fn stop(process: crate::support::GatewayProcess, dir: &std::path::Path) -> String {
    let status = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .expect("terminate task");
    assert_eq!(status.code(), Some(0), "{status}");
    std::fs::read_to_string(stderr_path(dir)).expect("read stderr")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_access_log_has_one_line_per_request_with_what_the_gateway_decided() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let routes = fenced_route("docs", &upstream.url(), "enforce", "monotonic");
    let process = Launch::new()
        .logging("info", &["--log-format", "json"])
        .start(dir.path(), &routes);
    let url = process.url("/docs/7");
    let traceparent = client_traceparent();
    let admitted = send(
        "PUT",
        &url,
        &[
            ("x-fence", "5"),
            ("traceparent", &traceparent),
            ("user-agent", "fencegate-test/1"),
            // Not trusted on this route: not shown.
            ("x-forwarded-for", "10.1.1.1"),
        ],
        "v5",
    )
    .await;
    assert_eq!(admitted.status, 200, "{admitted:?}");
    let stale = send("PUT", &url, &[("x-fence", "3")], "v3").await;
    assert_eq!(stale.status, 409, "{stale:?}");
    let read = send("GET", &url, &[], "").await;
    assert_eq!(read.status, 200, "{read:?}");
    let log = stop(process, dir.path()).await;
    let lines = access_lines(&log);
    assert_eq!(lines.len(), 3, "one access line per request:\n{log}");
    let id = |reply: &crate::support::Reply| {
        reply.headers["x-request-id"]
            .to_str()
            .expect("ascii id")
            .to_owned()
    };
    let (a, s, r) = (&lines[0], &lines[1], &lines[2]);
    assert_eq!(a["request_id"], id(&admitted));
    assert_eq!(a["method"], "PUT");
    assert_eq!(a["path"], "/docs/7");
    assert_eq!(a["route"], "docs");
    assert_eq!(a["key"], "docs:7");
    assert_eq!(a["token"], 5);
    assert_eq!(a["verdict"], "admitted");
    assert_eq!(a["status"], 200);
    assert_eq!(a["bytes"], admitted.body.len() as u64);
    assert_eq!(a["complete"], true);
    assert_eq!(a["trace_id"], TRACE_ID);
    assert!(a["upstream_ms"].as_f64().is_some(), "{a}");
    assert_eq!(a["client"], "127.0.0.1");
    assert_eq!(
        a["host"],
        url.trim_start_matches("http://").split('/').next().unwrap()
    );
    assert_eq!(a["protocol"], "HTTP/1.1");
    assert_eq!(a["user_agent"], "fencegate-test/1");
    assert_eq!(a["bytes_received"], 2, "the body v5");
    assert_eq!(
        a["upstream"],
        upstream.url().trim_start_matches("http://"),
        "{a}"
    );
    assert!(a.get("forwarded_for").is_none(), "untrusted: {a}");
    assert_eq!(s["request_id"], id(&stale));
    assert_eq!(s["verdict"], "refused");
    assert_eq!(s["reason"], "stale-fence");
    assert_eq!(s["status"], 409);
    assert_eq!(s["token"], 3);
    assert_eq!(s["bytes"], stale.body.len() as u64);
    assert!(s.get("upstream_ms").is_none(), "never forwarded: {s}");
    assert!(s.get("upstream").is_none(), "never forwarded: {s}");
    assert_eq!(r["verdict"], "unfenced");
    assert_eq!(r["status"], 200);
    assert!(r.get("key").is_none(), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_combined_format_is_nginx_s_line_with_the_gateway_s_fields_after_it() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let routes = fenced_route("docs", &upstream.url(), "enforce", "monotonic").replacen(
        "name = \"docs\"\n",
        "name = \"docs\"\ntrust_forwarded = true\n",
        1,
    );
    assert!(
        routes.contains("trust_forwarded"),
        "the route template changed"
    );
    let process = Launch::new()
        .server("access_log_format = \"combined\"")
        .logging("info", &[])
        .start(dir.path(), &routes);
    let url = process.url("/docs/7");
    let admitted = send(
        "PUT",
        &url,
        &[
            ("x-fence", "5"),
            ("user-agent", "curl/8 \"quoted\""),
            ("referer", "https://example.test/from"),
            ("x-forwarded-for", "10.1.1.1"),
        ],
        "v5",
    )
    .await;
    assert_eq!(admitted.status, 200, "{admitted:?}");
    let stale = send("PUT", &url, &[("x-fence", "3")], "").await;
    assert_eq!(stale.status, 409, "{stale:?}");
    let log = stop(process, dir.path()).await;
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("fencegate::access"))
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    let line = |n: usize| {
        let at = lines[n]
            .find("127.0.0.1 - - [")
            .unwrap_or_else(|| panic!("no combined line: {}", lines[n]));
        &lines[n][at..]
    };
    let (a, s) = (line(0), line(1));
    // `[07/Dec/2026:16:00:00 +0000]`
    let time = &a["127.0.0.1 - - [".len()..];
    let time = &time[..time.find(']').expect("the time's end")];
    assert_eq!(time.len(), 26, "{time}");
    assert!(
        time.ends_with(" +0000") && time.as_bytes()[2] == b'/',
        "{time}"
    );
    let after_time = &a[a.find("] ").expect("after the time") + 2..];
    // A quote inside a quoted field is written `\x22`, as nginx writes it; the log's escaping
    // doubles every backslash, so the line reads `\\x22`.
    let bytes = admitted.body.len();
    assert!(
        after_time.starts_with(&format!(
            "\"PUT /docs/7 HTTP/1.1\" 200 {bytes} \"https://example.test/from\" \"curl/8 \\\\x22quoted\\\\x22\" "
        )),
        "{a}"
    );
    for field in [
        "forwarded_for=\"10.1.1.1\"",
        "route=docs",
        "key=docs:7",
        "token=5",
        "verdict=admitted",
        "reason=-",
        "bytes_received=2",
        "complete=true",
        &format!("upstream={}", upstream.url().trim_start_matches("http://")),
        &format!(
            "request_id={}",
            admitted.headers["x-request-id"].to_str().expect("ascii id")
        ),
    ] {
        assert!(a.contains(&format!(" {field}")), "{field} in {a}");
    }
    assert!(
        s.contains("\"PUT /docs/7 HTTP/1.1\" 409 ")
            && s.contains(" verdict=refused reason=stale-fence "),
        "{s}"
    );
    assert!(s.contains(" upstream=- upstream_ms=- "), "{s}");
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_upstream_failures_and_abandoned_requests_have_their_lines() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    // The route's upstream timeout is 2 s.
    let routes = fenced_route("docs", &upstream.url(), "enforce", "monotonic");
    let process = Launch::new()
        .logging("info", &["--log-format", "json"])
        .start(dir.path(), &routes);
    let claim = send(
        "POST",
        &process.url("/_fencegate/claim/docs:4"),
        &[("x-fence", "9")],
        "",
    )
    .await;
    assert_eq!(claim.status, 200, "{claim:?}");
    // Admitted, then the upstream does not answer within the route's timeout.
    let timed_out = send(
        "PUT",
        &process.url("/docs/5"),
        &[("x-fence", "1"), (DELAY_HEADER, "3000")],
        "x",
    )
    .await;
    assert_eq!(timed_out.status, 504, "{timed_out:?}");
    // The client leaves before the answer: the request ends without a response head.
    let left = tokio::time::timeout(
        Duration::from_millis(500),
        send(
            "PUT",
            &process.url("/docs/6"),
            &[("x-fence", "1"), (DELAY_HEADER, "1500")],
            "x",
        ),
    )
    .await;
    assert!(left.is_err(), "the client was meant to give up first");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = stop(process, dir.path()).await;
    let lines = access_lines(&log);
    let line = |key: &str| {
        lines
            .iter()
            .find(|l| l["key"] == key)
            .unwrap_or_else(|| panic!("no access line for {key}:\n{log}"))
            .clone()
    };
    let claimed = line("docs:4");
    assert_eq!(claimed["verdict"], "claimed");
    assert_eq!(claimed["token"], 9);
    assert_eq!(claimed["route"], "_claim");
    let failed = line("docs:5");
    assert_eq!(
        failed["verdict"], "admitted",
        "the fence let it through: {failed}"
    );
    assert_eq!(failed["reason"], "upstream-timeout");
    assert_eq!(failed["status"], 504);
    let abandoned = line("docs:6");
    assert_eq!(abandoned["verdict"], "admitted");
    assert!(
        abandoned.get("status").is_none(),
        "no response head: {abandoned}"
    );
    assert_eq!(abandoned["complete"], false);
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_keeps_refusals_and_off_writes_nothing() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let routes = fenced_route("docs", &upstream.url(), "enforce", "monotonic");
    for (options, expected) in [
        ("access_log_sample = 0.0", vec!["refused"]),
        (
            "access_log_sample = 0.5",
            vec!["admitted", "refused", "unfenced"],
        ),
        ("access_log = false", vec![]),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let process = Launch::new()
            .server(options)
            .logging("info", &["--log-format", "json"])
            .start(dir.path(), &routes);
        let url = process.url("/docs/1");
        for (token, status) in [("5", 200), ("6", 200), ("3", 409), ("7", 200)] {
            let reply = send("PUT", &url, &[("x-fence", token)], "x").await;
            assert_eq!(reply.status, status, "{options}: {reply:?}");
        }
        for _ in 0..2 {
            assert_eq!(send("GET", &url, &[], "").await.status, 200);
        }
        let log = stop(process, dir.path()).await;
        let mut verdicts: Vec<String> = access_lines(&log)
            .iter()
            .map(|l| l["verdict"].as_str().unwrap_or_default().to_owned())
            .collect();
        verdicts.sort();
        verdicts.dedup();
        assert_eq!(verdicts, expected, "{options}:\n{log}");
        let kept = access_lines(&log).len();
        match options {
            // Half of the 5 ordinary requests (2, evenly spread) and the refusal.
            "access_log_sample = 0.5" => assert_eq!(kept, 3, "{log}"),
            "access_log_sample = 0.0" => assert_eq!(kept, 1, "{log}"),
            _ => assert_eq!(kept, 0, "{log}"),
        }
    }
}

/// An OTLP/HTTP receiver: decodes every export and keeps its spans.
struct Collector {
    addr: std::net::SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = Arc::clone(&spans);
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let kept = Arc::clone(&kept);
                async move {
                    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    for resource in request.resource_spans {
                        let service = resource
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.name")
                            .and_then(|a| a.value.as_ref()?.value.clone());
                        assert_eq!(service, Some(Value::StringValue("fencegate-test".into())));
                        for scope in resource.scope_spans {
                            kept.lock().expect("spans lock").extend(scope.spans);
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the collector");
        let addr = listener.local_addr().expect("collector address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Collector { addr, spans, task }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("spans lock").clone()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.clone())
}

/// `(trace id, parent id)` of a `traceparent` value.
fn parse_traceparent(value: &str) -> (String, String) {
    let fields: Vec<&str> = value.split('-').collect();
    assert_eq!(fields.len(), 4, "{value}");
    assert_eq!(fields[0], "00", "{value}");
    (fields[1].to_owned(), fields[2].to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_are_exported_and_the_upstream_sees_the_gateway_as_its_parent() {
    let collector = Collector::start().await;
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let routes = fenced_route("docs", &upstream.url(), "enforce", "monotonic");
    let process = Launch::new()
        .table(&format!(
            "[telemetry]\notlp_endpoint = \"http://{}\"\nservice_name = \"fencegate-test\"\n",
            collector.addr
        ))
        .start(dir.path(), &routes);
    let url = process.url("/docs/9");
    let traceparent = client_traceparent();
    let joined = send(
        "PUT",
        &url,
        &[
            ("x-fence", "4"),
            ("traceparent", &traceparent),
            ("tracestate", "vendor=opaque"),
        ],
        "x",
    )
    .await;
    assert_eq!(joined.status, 200, "{joined:?}");
    let fresh = send("PUT", &url, &[("x-fence", "5")], "x").await;
    assert_eq!(fresh.status, 200, "{fresh:?}");
    let refused = send(
        "PUT",
        &url,
        &[("x-fence", "1"), ("traceparent", &traceparent)],
        "x",
    )
    .await;
    assert_eq!(refused.status, 409, "{refused:?}");
    // Shutting down flushes the batch.
    let status = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .expect("terminate task");
    assert_eq!(status.code(), Some(0), "{status}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while collector.spans().len() < 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spans = collector.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let seen = upstream.seen();
    assert_eq!(
        seen.len(),
        2,
        "the refused write never reached the upstream"
    );

    // Joined the client's trace: the upstream's parent is the gateway's span, not the client's.
    let (trace, parent) = parse_traceparent(seen[0].header("traceparent").expect("traceparent"));
    assert_eq!(trace, TRACE_ID);
    assert_ne!(parent, CLIENT_SPAN);
    assert_eq!(seen[0].header("tracestate"), Some("vendor=opaque"));
    let span = spans
        .iter()
        .find(|s| hex(&s.span_id) == parent)
        .expect("the upstream's parent span was exported");
    assert_eq!(hex(&span.trace_id), TRACE_ID);
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN);
    assert_eq!(span.name, "PUT docs");
    assert_eq!(
        attribute(span, "fencegate.key"),
        Some(Value::StringValue("docs:9".into()))
    );
    assert_eq!(attribute(span, "fencegate.token"), Some(Value::IntValue(4)));
    assert_eq!(
        attribute(span, "fencegate.verdict"),
        Some(Value::StringValue("admitted".into()))
    );
    assert_eq!(
        attribute(span, "http.response.status_code"),
        Some(Value::IntValue(200))
    );

    // No traceparent: a new trace, rooted at the gateway.
    let (trace, parent) = parse_traceparent(seen[1].header("traceparent").expect("traceparent"));
    assert_ne!(trace, TRACE_ID);
    let root = spans
        .iter()
        .find(|s| hex(&s.span_id) == parent)
        .expect("the new trace's span was exported");
    assert_eq!(hex(&root.trace_id), trace);
    assert!(root.parent_span_id.is_empty(), "{root:?}");

    // The refusal has its span too.
    let refusal = spans
        .iter()
        .find(|s| attribute(s, "fencegate.refusal").is_some())
        .expect("the refusal's span");
    assert_eq!(hex(&refusal.trace_id), TRACE_ID);
    assert_eq!(
        attribute(refusal, "fencegate.refusal"),
        Some(Value::StringValue("stale-fence".into()))
    );
    assert_eq!(
        attribute(refusal, "http.response.status_code"),
        Some(Value::IntValue(409))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_telemetry_trace_context_reaches_the_upstream_untouched() {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let routes = fenced_route("docs", &upstream.url(), "enforce", "monotonic");
    let process = Launch::new().start(dir.path(), &routes);
    let traceparent = client_traceparent();
    let reply = send(
        "PUT",
        &process.url("/docs/2"),
        &[
            ("x-fence", "1"),
            ("traceparent", &traceparent),
            ("tracestate", "a=b"),
        ],
        "x",
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let seen = upstream.seen();
    assert_eq!(seen[0].header("traceparent"), Some(traceparent.as_str()));
    assert_eq!(seen[0].header("tracestate"), Some("a=b"));
    let none = send("PUT", &process.url("/docs/3"), &[("x-fence", "1")], "x").await;
    assert_eq!(none.status, 200, "{none:?}");
    assert_eq!(upstream.seen()[1].header("traceparent"), None);
}
