//! fencegate: a fencing-aware HTTP reverse proxy. Stale lock holders cannot write: every fenced
//! request's token is compared with its resource key's durable high-water mark before it is
//! forwarded.
//!
//! The invariants I1–I7, the request outcomes and which modules keep them: `docs/design.md`.
//!
//! # Layout
//!
//! Following a request:
//!
//! - [`config`]: the TOML file's shape, loading and validation (`fencegate check-config`).
//! - [`route`]: the canonical form of a request's path, method spellings and fenced method sets,
//!   path patterns, resource-key templates and the compiled route table (which reads `;`
//!   parameters and format suffixes every way an upstream might).
//! - [`server`]: the listeners — HTTP/1.1 and h2c, header, stream and connection limits (a 503
//!   refusal over `max_connections`), a timeout for every connection state, graceful drain on
//!   shutdown; the admin listener's own cap.
//! - [`descriptors`]: the open-file limit, raised at start and checked against every cap.
//! - [`budget`]: the process-wide budget for bodies held in memory (503 `memory-busy`).
//! - [`request_id`]: `X-Request-Id` — kept from the client when sane, else generated; forwarded,
//!   returned on every response and logged with every refusal.
//! - [`gateway`]: the checks of a request's head (method, `Host`), the reserved `/_fencegate/`
//!   endpoints (claiming), WebDAV destinations, and the request stack, assembled in one place:
//!   routing → fence → idempotency → ordering gate → proxy.
//! - [`fence`]: token parsing, signed tokens, `max_advance`, and the fence layer
//!   (compare-and-advance before forwarding).
//! - [`idempotency`]: stable idempotency keys and intent records for providers that cannot be
//!   fenced.
//! - [`gate`]: serialized generations — one forwarded write per key at a time (I4).
//! - [`store`]: the `FenceStore` trait and its backends (embedded SQLite).
//! - [`proxy`]: header rules (hop-by-hop, `Via`, `Forwarded`), upstream targets and forwarding.
//! - [`error`] and [`problem`]: every failure as a typed error, answered as RFC 9457 problem details.
//! - [`stats`]: per-route counters of fence outcomes.
//! - [`metrics`]: the Prometheus registry and its text exposition.
//! - [`reload`]: the route table in force, swapped atomically on SIGHUP or `POST /admin/reload`.
//! - [`admin`]: the admin listener — metrics, health, marks, routes, intents.
//! - [`app`]: wiring — opens the store, compiles routes, serves until shutdown.
//! - [`logging`]: the log subscriber, text or JSON lines, with every value from a request
//!   escaped.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod body;
pub mod budget;
pub mod checks;
pub mod compiled;
pub mod config;
pub mod descriptors;
pub mod error;
pub mod extensions;
pub mod fence;
pub mod gate;
pub mod gateway;
pub mod idempotency;
pub mod logging;
pub mod metrics;
pub mod problem;
pub mod proxy;
pub mod reload;
pub mod request_id;
pub mod route;
pub mod server;
pub mod stats;
pub mod store;
pub mod token;

pub use app::{App, StartError};
pub use compiled::Compiled;
pub use config::Config;
