//! Prometheus metrics: the registry of counters, gauges and histograms the request path updates,
//! and the text exposition for `/metrics`. Never labelled by resource key: label values come
//! from the configuration (route names, backends) and fixed sets (outcomes, reasons, methods,
//! status codes). Series live in the registry, not in a route table, so reloads never reset them.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use prometheus::core::Collector;
use prometheus::{
    Encoder as _, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::authority::AuthorityMetrics;
use crate::route::{CompiledRoute, RouteTable};
use crate::route::{
    ResponseSeries, RouteCounters, RouteMetrics, METHOD_LABELS as METHOD_LABEL_COUNT,
};

/// Store operations' buckets, from 100 µs to 10 s: round trips sit at the low end, and a call
/// is cut off by its route's `store_timeout` (2 s by default).
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0,
];

/// Requests', upstream calls' and gate waits' buckets, from 500 µs to 60 s: past the default 30 s
/// route timeout and 10 s gate timeout, so a request that ran into one lands in a bucket of its
/// own, not in `+Inf`.
const REQUEST_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The `method` label values: the methods a route may forward, and `other` for any else.
const METHOD_LABELS: [&str; METHOD_LABEL_COUNT] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other",
];

/// The index of `method`'s label in [`METHOD_LABELS`] (bounded).
fn method_index(method: &Method) -> usize {
    match *method {
        Method::GET => 0,
        Method::HEAD => 1,
        Method::POST => 2,
        Method::PUT => 3,
        Method::PATCH => 4,
        Method::DELETE => 5,
        Method::OPTIONS => 6,
        _ => 7,
    }
}

/// The `method` label of `method`.
pub fn method_label(method: &Method) -> &'static str {
    METHOD_LABELS[method_index(method)]
}

/// The fence's per-route counters, as series (see [`RouteCounters`]).
struct FenceSeries {
    rejections: IntCounterVec,
    accepted: IntCounterVec,
    advances: IntCounterVec,
    store_errors: IntCounterVec,
    failed_open: IntCounterVec,
    observed_refusals: IntCounterVec,
    provider_replays: IntCounterVec,
    transient_answers: IntCounterVec,
}

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    /// Answers by route, method and status code.
    pub responses: IntCounterVec,
    pub request_duration: HistogramVec,
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
    /// `[server] max_buffered_bytes`.
    pub buffered_bytes_limit: IntGauge,
    /// The lock authorities' watch state, events and checks, by route.
    pub authority: AuthorityMetrics,
    fence: FenceSeries,
    /// Intent records by state, counted in the store when `/metrics` is read.
    intents: IntGaugeVec,
    intent_oldest_submitting_age: Gauge,
    /// The `notAfter` of each certificate the gateway presents, by certificate.
    certificate_expiry: GaugeVec,
}

/// Registers metrics of fixed, distinct names, which cannot fail.
struct Registrar<'r>(&'r Registry);

impl Registrar<'_> {
    fn add<M: Collector + Clone + 'static>(&self, metric: M) -> M {
        self.0
            .register(Box::new(metric.clone()))
            .expect("metric names are distinct");
        metric
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter"))
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help).expect("valid counter"))
    }

    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help).expect("valid gauge"))
    }

    fn histograms(&self, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, labels).expect("valid histogram"))
    }
}

impl Metrics {
    /// Creates the registry, with the process's own metrics where the platform has them.
    pub fn new() -> Arc<Metrics> {
        let registry = Registry::new();
        let add = Registrar(&registry);
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("metric names are distinct");
        add.gauges(
            "fencegate_build_info",
            "The running build; always 1.",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        let authority = AuthorityMetrics {
            up: add.gauges(
                "fencegate_authority_up",
                "1 while the gateway follows the route's lock service, 0 while it cannot.",
                &["route"],
            ),
            events: add.counters(
                "fencegate_authority_events_total",
                "Lock grants and ended leases the gateway saw, per route (event: grant, end).",
                &["route", "event"],
            ),
            checks: add.counters(
                "fencegate_authority_checks_total",
                "Fenced writes checked against the lock service, per route and outcome (passed, lease_ended, unavailable, plain).",
                &["route", "outcome"],
            ),
        };
        let per_route = |name: &str, help: &str| add.counters(name, help, &["route"]);
        let fence = FenceSeries {
            rejections: add.counters(
                "fencegate_fence_rejections_total",
                "Fenced requests refused (or, in observe mode, that would have been), per route and reason.",
                &["route", "reason"],
            ),
            accepted: per_route(
                "fencegate_fence_accepted_total",
                "Fenced requests whose token passed the check.",
            ),
            advances: per_route(
                "fencegate_fence_advances_total",
                "Accepted tokens that raised a key's mark: new generations, i.e. owner churn.",
            ),
            store_errors: per_route(
                "fencegate_fence_store_errors_total",
                "Fenced requests that met a store failure or timeout, per route.",
            ),
            failed_open: per_route(
                "fencegate_fence_failed_open_total",
                "Fenced requests forwarded unchecked because the store failed on a route with on_store_error = fail_open.",
            ),
            observed_refusals: per_route(
                "fencegate_fence_observed_refusals_total",
                "Requests observe mode forwarded although enforce would have refused them.",
            ),
            provider_replays: per_route(
                "fencegate_idempotency_provider_replays_total",
                "Answers on idempotent routes that the provider marked as its own replay of the key (its replay header), forwarded as they came.",
            ),
            transient_answers: per_route(
                "fencegate_idempotency_transient_answers_total",
                "Answers on idempotent routes whose status says the provider did nothing (transient_statuses): passed on, intent released, not recorded.",
            ),
        };
        Arc::new(Metrics {
            requests: add.counters(
                "fencegate_requests_total",
                "Requests answered, per route and outcome (forwarded, replayed, refused, failed).",
                &["route", "outcome"],
            ),
            responses: add.counters(
                "fencegate_responses_total",
                "Responses by route, request method (other: any method a route does not forward) and status code.",
                &["route", "method", "code"],
            ),
            request_duration: add.histograms(
                "fencegate_request_duration_seconds",
                "Time from a routed request's head to its response head: the checks, the store, the gate and the upstream together.",
                &["route"],
                &REQUEST_BUCKETS,
            ),
            store_duration: add.histograms(
                "fencegate_store_operation_duration_seconds",
                "Time of fence-store operations.",
                &["backend", "op"],
                &LATENCY_BUCKETS,
            ),
            store_errors: add.counters(
                "fencegate_store_errors_total",
                "Fence-store operations that failed or timed out.",
                &["backend"],
            ),
            upstream_duration: add.histograms(
                "fencegate_upstream_request_duration_seconds",
                "Time from forwarding a request to the upstream's response head.",
                &["route"],
                &REQUEST_BUCKETS,
            ),
            gate_wait: add.histograms(
                "fencegate_gate_wait_duration_seconds",
                "Time a serialized write waited for its key's earlier writes.",
                &["route"],
                &REQUEST_BUCKETS,
            ),
            inflight: add.gauges(
                "fencegate_inflight_requests",
                "Requests being handled, per route.",
                &["route"],
            ),
            reloads: add.counters(
                "fencegate_config_reloads_total",
                "Configuration reloads, by result (ok, error).",
                &["result"],
            ),
            restart_required: add.gauges(
                "fencegate_reload_restart_required",
                "1 for each configuration section changed in the file that only a restart applies.",
                &["section"],
            ),
            connections_refused: add.counter(
                "fencegate_connections_refused_total",
                "Client connections refused (503, closed) because server.max_connections were open.",
            ),
            open_connections: add.gauge(
                "fencegate_open_connections",
                "Client connections open on the data-plane listener.",
            ),
            connections_closed: add.counters(
                "fencegate_connections_closed_total",
                "Connections closed for overstaying a state (silent, idle, slow-head, not-reading), by listener.",
                &["listener", "reason"],
            ),
            admin_connections_refused: add.counter(
                "fencegate_admin_connections_refused_total",
                "Admin connections refused (503, closed) because admin.max_connections were open.",
            ),
            buffered_bytes: add.gauge(
                "fencegate_buffered_body_bytes",
                "Bytes of request and response bodies held in memory (server.max_buffered_bytes).",
            ),
            buffered_bytes_limit: add.gauge(
                "fencegate_buffered_body_bytes_limit",
                "server.max_buffered_bytes: the most body bytes held in memory at once.",
            ),
            intents: add.gauges(
                "fencegate_intents",
                "Intent records by state, counted in the store at each scrape (submitting: the outcome is not known; completed: held for replay until pruned).",
                &["state"],
            ),
            intent_oldest_submitting_age: add.add(
                Gauge::new(
                    "fencegate_intent_oldest_submitting_age_seconds",
                    "Age of the oldest SUBMITTING intent's last update (0 with none), read at each scrape.",
                )
                .expect("valid gauge"),
            ),
            certificate_expiry: add.add(
                GaugeVec::new(
                    Opts::new(
                        "fencegate_certificate_expiry_timestamp_seconds",
                        "The notAfter of each certificate the gateway presents (server, admin, upstream:<route>), in Unix seconds.",
                    ),
                    &["certificate"],
                )
                .expect("valid gauge"),
            ),
            authority,
            fence,
            registry,
        })
    }

    /// Points every route of `table` at its series in this registry, before the table serves:
    /// a route counts on from its predecessor of the same name.
    pub fn bind(&self, table: &RouteTable) {
        for route in table.routes() {
            // Set before the table is published; a second bind of one table keeps the first.
            let _ = route.fence_counters.set(self.fence_counters(route));
        }
    }

    fn fence_counters(&self, route: &CompiledRoute) -> RouteCounters {
        let name = route.name.as_str();
        let series = &self.fence;
        let rejected = |reason| series.rejections.with_label_values(&[name, reason]);
        let of = |vec: &IntCounterVec| vec.with_label_values(&[name]);
        // Only idempotent routes have these series.
        let idempotent_only = |vec: &IntCounterVec| match route.idempotency {
            Some(_) => of(vec),
            None => RouteCounters::detached_counter(),
        };
        RouteCounters {
            accepted: of(&series.accepted),
            advanced: of(&series.advances),
            missing: rejected("missing"),
            invalid: rejected("invalid"),
            stale: rejected("stale"),
            too_far_ahead: rejected("too_far_ahead"),
            unsigned: rejected("unsigned"),
            bad_signature: rejected("bad_signature"),
            lease_ended: rejected("lease_ended"),
            store_errors: of(&series.store_errors),
            failed_open: of(&series.failed_open),
            observed_refusals: of(&series.observed_refusals),
            provider_replays: idempotent_only(&series.provider_replays),
            transient_answers: idempotent_only(&series.transient_answers),
        }
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
                duration: self.request_duration.with_label_values(&[name]),
                responses: ResponseSeries::default(),
            }
        })
    }

    /// Counts one answer of a request that matched no route.
    pub fn observe_unrouted(&self, route: &str, method: &Method, status: StatusCode) {
        self.responses
            .with_label_values(&[route, method_label(method), status.as_str()])
            .inc();
    }

    /// Counts one answer of `route`, through the route's own table of its series.
    pub fn observe_response(&self, route: &CompiledRoute, method: &Method, status: StatusCode) {
        let index = method_index(method);
        self.of_route(route)
            .responses
            .get(index, status.as_u16(), || {
                self.responses.with_label_values(&[
                    route.name.as_str(),
                    METHOD_LABELS[index],
                    status.as_str(),
                ])
            })
            .inc();
    }

    pub fn observe_store(&self, backend: &str, op: &str, took: Duration) {
        self.store_duration
            .with_label_values(&[backend, op])
            .observe(took.as_secs_f64());
    }

    /// Sets the intent gauges from a count in the store. `None`: the store could not be read;
    /// the count is left out of the exposition and the age is NaN, rather than either stale.
    pub fn set_intents(&self, census: Option<IntentGauges>) {
        self.intents.reset();
        match census {
            Some(census) => {
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                self.intents
                    .with_label_values(&["submitting"])
                    .set(count(census.submitting));
                self.intents
                    .with_label_values(&["completed"])
                    .set(count(census.completed));
                self.intent_oldest_submitting_age
                    .set(census.oldest_submitting_age.as_secs_f64());
            }
            None => self.intent_oldest_submitting_age.set(f64::NAN),
        }
    }

    /// Replaces the certificate gauges with `certificates`: (name, notAfter in Unix seconds).
    pub fn set_certificates<'c>(&self, certificates: impl IntoIterator<Item = (&'c str, i64)>) {
        self.certificate_expiry.reset();
        for (name, not_after) in certificates {
            self.certificate_expiry
                .with_label_values(&[name])
                .set(not_after as f64);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        // Encoding a registry of valid metrics into memory cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// What the intent gauges show: SUBMITTING intents and how long the oldest has waited, and
/// COMPLETED ones held for replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntentGauges {
    pub submitting: u64,
    pub oldest_submitting_age: Duration,
    pub completed: u64,
}
