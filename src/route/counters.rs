//! Per-route counters of fence outcomes and a route's handles into the labelled request metrics.
//! Both are series of the registry in `metrics.rs`, looked up by route name, so a reloaded route
//! counts on from where its predecessor of the same name stopped.

use std::sync::OnceLock;

use prometheus::{Histogram, IntCounter, IntGauge};

/// Counts for one route. Never keyed by resource key, so their number is bounded by the config.
/// Bound to the gateway's registry when the route table is installed ([`Metrics::bind`]); a
/// table compiled outside a gateway (`check-config`, unit tests) counts in detached counters.
///
/// [`Metrics::bind`]: crate::metrics::Metrics::bind
#[derive(Debug, Clone)]
pub struct RouteCounters {
    /// Fenced requests whose token passed and that were forwarded.
    pub accepted: IntCounter,
    /// Accepted requests that raised the key's mark (a new generation: owner churn).
    pub advanced: IntCounter,
    /// Refusals (enforce) or would-be refusals (observe), by reason.
    pub missing: IntCounter,
    pub invalid: IntCounter,
    pub stale: IntCounter,
    /// Tokens more than `max_advance` above their key's mark.
    pub too_far_ahead: IntCounter,
    /// Tokens without the lock authority's signature, and with a bad one.
    pub unsigned: IntCounter,
    pub bad_signature: IntCounter,
    /// Tokens the lock authority refused: their lease ended, or they are not the holder's.
    pub lease_ended: IntCounter,
    /// Store failures or timeouts met by fenced requests.
    pub store_errors: IntCounter,
    /// Requests forwarded unchecked because the store failed and the route fails open.
    pub failed_open: IntCounter,
    /// Requests that observe mode forwarded although enforce would have refused them.
    pub observed_refusals: IntCounter,
    /// Idempotent route: answers the provider marked as its own replay of the key.
    pub provider_replays: IntCounter,
    /// Idempotent route: answers that said the provider did nothing (`transient_statuses`).
    pub transient_answers: IntCounter,
}

impl RouteCounters {
    /// Counters registered nowhere, for a route that serves no gateway.
    pub fn detached() -> RouteCounters {
        let counter = RouteCounters::detached_counter;
        RouteCounters {
            accepted: counter(),
            advanced: counter(),
            missing: counter(),
            invalid: counter(),
            stale: counter(),
            too_far_ahead: counter(),
            unsigned: counter(),
            bad_signature: counter(),
            lease_ended: counter(),
            store_errors: counter(),
            failed_open: counter(),
            observed_refusals: counter(),
            provider_replays: counter(),
            transient_answers: counter(),
        }
    }

    /// One counter registered nowhere.
    pub fn detached_counter() -> IntCounter {
        // A fixed, valid name and help: construction cannot fail.
        IntCounter::new(
            "fencegate_detached_total",
            "Counts of a route outside a gateway.",
        )
        .expect("valid counter definition")
    }

    pub fn bump(counter: &IntCounter) {
        counter.inc();
    }

    pub fn read(counter: &IntCounter) -> u64 {
        counter.get()
    }
}

/// One route's series of the labelled request metrics, resolved once (on the route's first
/// request) instead of by a label lookup on every request.
pub struct RouteMetrics {
    pub inflight: IntGauge,
    /// `fencegate_requests_total` by outcome: forwarded, replayed, refused, failed.
    pub forwarded: IntCounter,
    pub replayed: IntCounter,
    pub refused: IntCounter,
    pub failed: IntCounter,
    pub upstream_duration: Histogram,
    /// `fencegate_request_duration_seconds`: the request's head received to its response head.
    pub duration: Histogram,
    /// `fencegate_responses_total` of this route, by method and status.
    pub responses: ResponseSeries,
}

/// How many `method` label values there are (`metrics::method_label`).
pub const METHOD_LABELS: usize = 8;

/// One route's `fencegate_responses_total` series, each looked up in the registry once (a
/// labelled lookup hashes its three values under a lock) and kept by method and status code. A
/// method's table of codes is made when the route first answers it.
#[derive(Default)]
pub struct ResponseSeries {
    by_method: [OnceLock<Box<[OnceLock<IntCounter>]>>; METHOD_LABELS],
}

impl ResponseSeries {
    /// The series of `method` (an index below [`METHOD_LABELS`]) and `code` (100 to 999, as
    /// `http::StatusCode` holds), from `lookup` the first time.
    pub fn get(
        &self,
        method: usize,
        code: u16,
        lookup: impl FnOnce() -> IntCounter,
    ) -> &IntCounter {
        let codes = self.by_method[method % METHOD_LABELS]
            .get_or_init(|| (100..1000).map(|_| OnceLock::new()).collect());
        let slot = usize::from(code.clamp(100, 999) - 100);
        codes[slot].get_or_init(lookup)
    }
}

impl RouteMetrics {
    /// The requests counter of `outcome` (one of the four labels above; anything else counts
    /// as failed).
    pub fn outcome(&self, outcome: &str) -> &IntCounter {
        match outcome {
            "forwarded" => &self.forwarded,
            "replayed" => &self.replayed,
            "refused" => &self.refused,
            _ => &self.failed,
        }
    }
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMetrics").finish_non_exhaustive()
    }
}
