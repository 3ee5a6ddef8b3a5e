//! Prometheus metrics: the registry of counters, gauges and histograms the request path updates,
//! and the text exposition for `/metrics`. Never labelled by resource key: label values come
//! from the configuration (route names, backends) and fixed sets (outcomes, reasons, operations).

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder as _, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::authority::AuthorityMetrics;
use crate::route::{CompiledRoute, RouteTable};
use crate::stats::{RouteCounters, RouteMetrics};

/// Latency buckets from 100 µs to 10 s: store round trips sit at the low end, upstream calls and
/// gate waits anywhere.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0,
];

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub store_duration: HistogramVec,
    pub store_errors: IntCounterVec,
    pub upstream_duration: HistogramVec,
    pub gate_wait: HistogramVec,
    pub inflight: IntGaugeVec,
    pub reloads: IntCounterVec,
    /// 1 for each configuration section (`server`, `store`, `admin`, `telemetry`) whose change
    /// in the file a reload could not apply: it waits for a restart.
    pub restart_required: IntGaugeVec,
    /// Client connections answered 503 and closed because `max_connections` were open.
    pub connections_refused: IntCounter,
    /// Client connections open on the data-plane listener.
    pub open_connections: IntGauge,
    /// Connections (data plane or admin) closed for overstaying a state, by listener and reason.
    pub connections_closed: IntCounterVec,
    /// Admin connections answered 503 and closed because `[admin] max_connections` were open.
    pub admin_connections_refused: IntCounter,
    /// Bytes of bodies held in memory under `[server] max_buffered_bytes`.
    pub buffered_bytes: IntGauge,
    /// The lock authorities' watch state, events and checks, by route.
    pub authority: AuthorityMetrics,
}

impl Metrics {
    /// Creates the registry. Registration of fixed, distinct names cannot fail.
    pub fn new() -> Arc<Metrics> {
        let registry = Registry::new();
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let metric = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
                labels,
            )
            .expect("valid histogram definition");
            registry
                .register(Box::new(metric.clone()))
                .expect("metric names are distinct");
            metric
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("valid counter definition");
            registry
                .register(Box::new(metric.clone()))
                .expect("metric names are distinct");
            metric
        };
        let inflight = IntGaugeVec::new(
            Opts::new(
                "fencegate_inflight_requests",
                "Requests being handled, per route.",
            ),
            &["route"],
        )
        .expect("valid gauge definition");
        registry
            .register(Box::new(inflight.clone()))
            .expect("metric names are distinct");
        let restart_required = IntGaugeVec::new(
            Opts::new(
                "fencegate_reload_restart_required",
                "1 for each configuration section changed in the file that only a restart applies.",
            ),
            &["section"],
        )
        .expect("valid gauge definition");
        registry
            .register(Box::new(restart_required.clone()))
            .expect("metric names are distinct");
        let build_info = IntGaugeVec::new(
            Opts::new("fencegate_build_info", "The running build; always 1."),
            &["version"],
        )
        .expect("valid gauge definition");
        registry
            .register(Box::new(build_info.clone()))
            .expect("metric names are distinct");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let connections_refused = IntCounter::new(
            "fencegate_connections_refused_total",
            "Client connections refused (503, closed) because server.max_connections were open.",
        )
        .expect("valid counter definition");
        registry
            .register(Box::new(connections_refused.clone()))
            .expect("metric names are distinct");
        let open_connections = IntGauge::new(
            "fencegate_open_connections",
            "Client connections open on the data-plane listener.",
        )
        .expect("valid gauge definition");
        registry
            .register(Box::new(open_connections.clone()))
            .expect("metric names are distinct");
        let admin_connections_refused = IntCounter::new(
            "fencegate_admin_connections_refused_total",
            "Admin connections refused (503, closed) because admin.max_connections were open.",
        )
        .expect("valid counter definition");
        registry
            .register(Box::new(admin_connections_refused.clone()))
            .expect("metric names are distinct");
        let buffered_bytes = IntGauge::new(
            "fencegate_buffered_body_bytes",
            "Bytes of request and response bodies held in memory (server.max_buffered_bytes).",
        )
        .expect("valid gauge definition");
        registry
            .register(Box::new(buffered_bytes.clone()))
            .expect("metric names are distinct");
        let authority_up = IntGaugeVec::new(
            Opts::new(
                "fencegate_authority_up",
                "1 while the gateway follows the route's lock service, 0 while it cannot.",
            ),
            &["route"],
        )
        .expect("valid gauge definition");
        registry
            .register(Box::new(authority_up.clone()))
            .expect("metric names are distinct");
        let authority = AuthorityMetrics {
            up: authority_up,
            events: counter(
                "fencegate_authority_events_total",
                "Lock grants and ended leases the gateway saw, per route (event: grant, end).",
                &["route", "event"],
            ),
            checks: counter(
                "fencegate_authority_checks_total",
                "Fenced writes checked against the lock service, per route and outcome (passed, lease_ended, unavailable, plain).",
                &["route", "outcome"],
            ),
        };
        Arc::new(Metrics {
            authority,
            connections_refused,
            open_connections,
            admin_connections_refused,
            buffered_bytes,
            connections_closed: counter(
                "fencegate_connections_closed_total",
                "Connections closed for overstaying a state (silent, idle, slow-head, not-reading), by listener.",
                &["listener", "reason"],
            ),
            requests: counter(
                "fencegate_requests_total",
                "Requests answered, per route and outcome (forwarded, replayed, refused, failed).",
                &["route", "outcome"],
            ),
            store_duration: histogram(
                "fencegate_store_operation_duration_seconds",
                "Time of fence-store operations.",
                &["backend", "op"],
            ),
            store_errors: counter(
                "fencegate_store_errors_total",
                "Fence-store operations that failed or timed out.",
                &["backend"],
            ),
            upstream_duration: histogram(
                "fencegate_upstream_request_duration_seconds",
                "Time from forwarding a request to the upstream's response head.",
                &["route"],
            ),
            gate_wait: histogram(
                "fencegate_gate_wait_duration_seconds",
                "Time a serialized write waited for its key's earlier writes.",
                &["route"],
            ),
            reloads: counter(
                "fencegate_config_reloads_total",
                "Configuration reloads, by result (ok, error).",
                &["result"],
            ),
            inflight,
            restart_required,
            registry,
        })
    }

    /// `route`'s series of the labelled metrics, looked up on its first request and kept in
    /// the route. (A compiled route serves one gateway, and so one registry.)
    pub fn of_route<'r>(&self, route: &'r CompiledRoute) -> &'r RouteMetrics {
        route.metrics.get_or_init(|| {
            let name = route.name.as_str();
            let outcome = |label| self.requests.with_label_values(&[name, label]);
            RouteMetrics {
                inflight: self.inflight.with_label_values(&[name]),
                forwarded: outcome("forwarded"),
                replayed: outcome("replayed"),
                refused: outcome("refused"),
                failed: outcome("failed"),
                upstream_duration: self.upstream_duration.with_label_values(&[name]),
            }
        })
    }

    pub fn observe_store(&self, backend: &str, op: &str, took: Duration) {
        self.store_duration
            .with_label_values(&[backend, op])
            .observe(took.as_secs_f64());
    }

    /// The Prometheus text exposition: the registry plus the per-route fence counters.
    pub fn render(&self, routes: &RouteTable) -> String {
        let mut buffer = Vec::new();
        // Encoding a registry of valid metrics into memory cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        let mut text = String::from_utf8(buffer).unwrap_or_default();
        render_route_counters(&mut text, routes);
        text
    }
}

/// `fencegate_fence_rejections_total{route,reason}` and `fencegate_fence_advances_total{route}`,
/// read from the per-route atomics the fence layer keeps.
fn render_route_counters(text: &mut String, routes: &RouteTable) {
    text.push_str("# HELP fencegate_fence_rejections_total Fenced requests refused (or, in observe mode, that would have been), per route and reason.\n");
    text.push_str("# TYPE fencegate_fence_rejections_total counter\n");
    for route in routes.routes() {
        let counters = &route.counters;
        for (reason, counter) in [
            ("stale", &counters.stale),
            ("missing", &counters.missing),
            ("invalid", &counters.invalid),
            ("too_far_ahead", &counters.too_far_ahead),
            ("unsigned", &counters.unsigned),
            ("bad_signature", &counters.bad_signature),
            ("lease_ended", &counters.lease_ended),
        ] {
            text.push_str(&format!(
                "fencegate_fence_rejections_total{{route=\"{}\",reason=\"{reason}\"}} {}\n",
                escape_label(&route.name),
                RouteCounters::read(counter)
            ));
        }
    }
    text.push_str("# HELP fencegate_fence_failed_open_total Fenced requests forwarded unchecked because the store failed on a route with on_store_error = fail_open.\n");
    text.push_str("# TYPE fencegate_fence_failed_open_total counter\n");
    for route in routes.routes() {
        text.push_str(&format!(
            "fencegate_fence_failed_open_total{{route=\"{}\"}} {}\n",
            escape_label(&route.name),
            RouteCounters::read(&route.counters.failed_open)
        ));
    }
    text.push_str("# HELP fencegate_idempotency_provider_replays_total Answers on idempotent routes that the provider marked as its own replay of the key (its replay header), forwarded as they came.\n");
    text.push_str("# TYPE fencegate_idempotency_provider_replays_total counter\n");
    for route in routes.routes().filter(|r| r.idempotency.is_some()) {
        text.push_str(&format!(
            "fencegate_idempotency_provider_replays_total{{route=\"{}\"}} {}\n",
            escape_label(&route.name),
            RouteCounters::read(&route.counters.provider_replays)
        ));
    }
    text.push_str("# HELP fencegate_idempotency_transient_answers_total Answers on idempotent routes whose status says the provider did nothing (transient_statuses): passed on, intent released, not recorded.\n");
    text.push_str("# TYPE fencegate_idempotency_transient_answers_total counter\n");
    for route in routes.routes().filter(|r| r.idempotency.is_some()) {
        text.push_str(&format!(
            "fencegate_idempotency_transient_answers_total{{route=\"{}\"}} {}\n",
            escape_label(&route.name),
            RouteCounters::read(&route.counters.transient_answers)
        ));
    }
    text.push_str("# HELP fencegate_fence_advances_total Accepted tokens that raised a key's mark: new generations, i.e. owner churn.\n");
    text.push_str("# TYPE fencegate_fence_advances_total counter\n");
    for route in routes.routes() {
        text.push_str(&format!(
            "fencegate_fence_advances_total{{route=\"{}\"}} {}\n",
            escape_label(&route.name),
            RouteCounters::read(&route.counters.advanced)
        ));
    }
}

/// Escapes a label value for the text format (backslash, double quote, newline).
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
