//! Per-route counters of fence outcomes, kept as plain atomics until the metrics exporter reads
//! them, and a route's handles into the Prometheus metrics labelled with its name.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::{Histogram, IntCounter, IntGauge};

/// Counts for one route. Never keyed by resource key, so their number is bounded by the config.
#[derive(Debug, Default)]
pub struct RouteCounters {
    /// Fenced requests whose token passed and that were forwarded.
    pub accepted: AtomicU64,
    /// Accepted requests that raised the key's mark (a new generation: owner churn).
    pub advanced: AtomicU64,
    /// Refusals (enforce) or would-be refusals (observe), by reason.
    pub missing: AtomicU64,
    pub invalid: AtomicU64,
    pub stale: AtomicU64,
    /// Tokens more than `max_advance` above their key's mark.
    pub too_far_ahead: AtomicU64,
    /// Tokens without the lock authority's signature, and with a bad one.
    pub unsigned: AtomicU64,
    pub bad_signature: AtomicU64,
    /// Tokens the lock authority refused: their lease ended, or they are not the holder's.
    pub lease_ended: AtomicU64,
    /// Store failures or timeouts met by fenced requests.
    pub store_errors: AtomicU64,
    /// Requests forwarded unchecked because the store failed and the route fails open.
    pub failed_open: AtomicU64,
    /// Requests that observe mode forwarded although enforce would have refused them.
    pub observed_refusals: AtomicU64,
    /// Idempotent route: answers the provider marked as its own replay of the key.
    pub provider_replays: AtomicU64,
    /// Idempotent route: answers that said the provider did nothing (`transient_statuses`).
    pub transient_answers: AtomicU64,
}

impl RouteCounters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn read(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
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
