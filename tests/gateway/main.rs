//! The gateway in process, on the embedded store, behind recording upstreams: what it forwards
//! and refuses (fencing outcomes, claims, ordering, limits, malformed HTTP, headers, request ids,
//! tokens, the admin listener, a failing store) and the I1 history check on one gateway. None of
//! these needs PostgreSQL, Redis or a framework upstream.
//!
//! One test binary for all of them: each links the whole crate. The modules share no
//! process-wide state: every gateway has its own temporary directory and listens on port 0.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod admin_problems;
mod admin_reconciliation;
mod admin_reload;
mod admin_routes;
mod claim;
mod client_http1;
mod concurrency;
mod embedded_layer;
mod fence_outcomes;
mod forwarding;
mod limits;
mod malformed_http;
mod metrics;
mod ordering;
mod provider_keys;
mod reconciliation;
mod request_bodies;
mod request_heads;
mod request_id;
mod response_bodies;
mod response_heads;
mod store_failures;
mod tls;
mod token_poisoning;
mod trust_boundaries;
mod typed_inputs;
mod upstream_framing;
mod upstream_pool;
