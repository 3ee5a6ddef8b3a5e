//! The configuration file's shape: what an operator may write, with defaults, exactly as it
//! deserializes from TOML. Loading and validation live in `load.rs`; durations in `duration.rs`.
//! One file per table: `server.rs`, `store.rs`, `route.rs` (with `[routes.idempotency]`),
//! `fence.rs` (`[routes.fence]`), `authority.rs` (`[routes.fence.authority]`), `admin.rs`,
//! `tls.rs` (every TLS table), `upstream_auth.rs` (`[routes.upstream_auth]`); `Config`, the whole file, here.
//! `secret.rs` reads the secrets the file names (from the environment or a file).

mod admin;
mod authority;
mod byte_size;
mod duration;
mod error;
mod features;
mod fence;
mod load;
mod route;
pub mod secret;
mod sections;
mod server;
mod store;
mod telemetry;
mod tls;
mod upstream_auth;

pub use admin::{AdminConfig, DEFAULT_ADMIN_MAX_CONNECTIONS};
pub use authority::{
    AuthorityConfig, AuthorityKind, OnAuthorityUnavailable, ZookeeperToken,
    DEFAULT_AUTHORITY_TIMEOUT, DEFAULT_LEASE_POLL_INTERVAL, DEFAULT_LEASE_TABLE,
    DEFAULT_ZOOKEEPER_SESSION_TIMEOUT,
};
pub use error::ConfigError;
pub use features::{check_built, not_built_message, NotBuilt};
pub use fence::{
    Compare, FenceConfig, FenceMode, OnStoreError, Ordering, DEFAULT_FENCE_HEADER,
    DEFAULT_GATE_TIMEOUT, DEFAULT_RESPONSE_READ_AHEAD, DEFAULT_SIGNATURE_HEADER,
    DEFAULT_STORE_TIMEOUT,
};
pub use load::{check_environment, load_file, parse_str};
pub use route::{
    ClientKey, CollectionWrites, CompletedWhenConfig, FormatSuffix, IdempotencyConfig, KeyEncoding,
    KeyFormat, PathParameters, RouteConfig, UnknownOutcome, WhenMissing,
    DEFAULT_IDEMPOTENCY_HEADER, DEFAULT_MAX_BODY, DEFAULT_MAX_REQUEST_BODY,
    DEFAULT_MAX_STORED_BODY, DEFAULT_RETENTION, DEFAULT_UPSTREAM_TIMEOUT,
};
pub use sections::{RestartSections, RESTART_SECTIONS};
pub use server::{
    AccessLogFormat, ServerConfig, DEFAULT_BODY_TIMEOUT, DEFAULT_BUFFER_WAIT,
    DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_HEAD_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_INTENT_PRUNE_INTERVAL, DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_CONCURRENT_STREAMS,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADERS, DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_UPSTREAM_CONNECTIONS, DEFAULT_SHUTDOWN_GRACE, DEFAULT_STATE_DIR,
    DEFAULT_STORE_CHECK_INTERVAL, DEFAULT_UPSTREAM_CONNECTION_WAIT, DEFAULT_WRITE_TIMEOUT,
    MIN_MAX_HEADER_BYTES,
};
pub use store::{
    EmbeddedStoreConfig, EtcdStoreConfig, PostgresStoreConfig, RedisStoreConfig, StoreConfig,
    DEFAULT_CACHE_CAPACITY, DEFAULT_EMBEDDED_PATH, DEFAULT_ETCD_KEY_PREFIX, DEFAULT_ETCD_MAX_BATCH,
    DEFAULT_ETCD_REQUEST_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_POSTGRES_BATCHES_IN_FLIGHT,
    DEFAULT_POSTGRES_MAX_CONNECTIONS, DEFAULT_POSTGRES_SCHEMA, DEFAULT_REDIS_KEY_PREFIX,
    DEFAULT_TURN_MARGIN,
};

pub use telemetry::{TelemetryConfig, DEFAULT_EXPORT_TIMEOUT, DEFAULT_SERVICE_NAME};
pub use tls::{
    ListenerTlsConfig, StoreTlsConfig, StoreTlsMode, UpstreamTlsConfig,
    DEFAULT_TLS_HANDSHAKE_TIMEOUT,
};
pub use upstream_auth::{
    ClientAuthMethod, UpstreamAuthConfig, UpstreamAuthKind, DEFAULT_TOKEN_REFRESH_BEFORE,
    DEFAULT_TOKEN_TIMEOUT,
};

use serde::Deserialize;

/// A whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// The admin listener; absent: no admin API.
    #[serde(default)]
    pub admin: Option<AdminConfig>,
    /// Span export; absent: trace context is forwarded untouched and nothing is exported.
    #[serde(default)]
    pub telemetry: Option<TelemetryConfig>,
}
