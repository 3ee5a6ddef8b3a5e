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
//! - [`config`]: the TOML file's shape, as plain data, read and checked; [`compiled`]: that data
//!   compiled once (the route table) for `check-config`, `serve` and every reload.
//! - [`route`]: the canonical form of a request's path, method spellings and fenced method sets,
//!   path patterns, resource-key templates, and the compiled route table with each route's
//!   settings (its upstream, its idempotency, which layer makes its advance, its counters),
//!   reading `;` parameters and format suffixes every way an upstream might.
//! - [`server`]: the listeners — the gateway's own HTTP/1.x server and hyper's HTTP/2 (h2c or
//!   ALPN), header, stream and connection limits (a 503 refusal over `max_connections`), a
//!   timeout for every connection state, graceful drain on shutdown; the admin listener's own cap.
//! - [`descriptors`]: the open-file limit, raised at start and checked against every cap.
//! - [`request_id`]: `X-Request-Id` — kept from the client when sane, else generated; forwarded,
//!   returned on every response and logged with every refusal.
//! - [`checks`]: the `Host` and WebDAV `Destination` of a request's head.
//! - [`gateway`]: the reserved `/_fencegate/` endpoints (claiming), and the request stack,
//!   assembled in one place: routing → fence → idempotency → ordering gate → proxy.
//! - [`token`]: fencing tokens as requests carry them, and the lock authority's signatures.
//! - [`fence`]: `max_advance`, the fence layer, and `FencedWrite`, the one door of a fenced
//!   write's store step (`fence/store_step.rs`), whichever layer owns it: read it to see what
//!   happens to a fenced write at the store.
//! - [`idempotency`]: stable idempotency keys and intent records for providers that cannot be
//!   fenced.
//! - [`gate`]: serialized generations — one forwarded write per key at a time (I4).
//! - [`authority`]: the lock service a route's tokens come from (etcd, a PostgreSQL lease table),
//!   followed by a watch: grants and ended leases raise marks, and live leases can be required.
//! - [`guard`]: what the gateway puts in front of the store it opened: the mark cache, trust in
//!   the store's identity, adoption, store metrics and the replica's name.
//! - [`store`]: the `FenceStore` trait and its backends (`embedded/`, `postgres/`, `redis/`,
//!   `etcd/`), with their shared plumbing.
//! - [`etcd`]: the client of etcd's v3 HTTP/JSON gateway the etcd store and authority share.
//! - [`proxy`]: header rules (hop-by-hop, `Via`, `Forwarded`), the stack's shared shapes (among
//!   them what the layers hand each other in request extensions) and forwarding.
//! - [`upstream_auth`]: credentials the gateway obtains for an upstream itself (OAuth2 client
//!   credentials), cached and renewed.
//! - [`tls`]: PEM files, the listeners' reloadable TLS settings, upstream TLS, and why a
//!   handshake with an upstream failed.
//! - [`embed`]: the fence as a tower layer for a service's own handlers, without the proxy.
//!
//! Shared by all of them, depending on none: [`body`] (the body types, and the process-wide budget
//! for bodies held in memory: 503 `memory-busy`), [`input_type`] (typed key inputs, `{id:int}`,
//! and the rule for untyped ones, shared by route patterns, key templates and lock mappings).
//! And around them: [`error`] (every failure as a kind in one table, answered as RFC 9457 problem details),
//! [`metrics`] (the Prometheus registry), [`reload`] (the route
//! table in force, swapped on SIGHUP or `POST /admin/reload`), [`admin`] (metrics, health, marks,
//! routes, intents), [`app`] (one way to start: `App::build` → `serve`) and [`logging`] (text or
//! JSON lines, with every value from a request escaped).
//!
//! Cargo features (all on by default): `embed` ([`embed`]), `postgres`, `redis` and `etcd` (those
//! stores, and the lock authorities on etcd and PostgreSQL), `otel` (span export), `admin`
//! ([`admin`] and its listener), `cli` (the binary). [`config`] refuses a configuration that
//! names a part this build left out (`config/features.rs`).
#![forbid(unsafe_code)]

#[cfg(feature = "admin")]
pub mod admin;
pub mod app;
pub mod authority;
pub mod body;
pub mod checks;
pub mod compiled;
pub mod config;
pub mod descriptors;
#[cfg(feature = "embed")]
pub mod embed;
pub mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod fence;
pub mod gate;
pub mod gateway;
pub mod guard;
pub mod idempotency;
pub mod input_type;
pub mod logging;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod request_id;
pub mod route;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod token;
pub mod upstream_auth;

pub use app::{App, StartError};
pub use compiled::Compiled;
pub use config::Config;
