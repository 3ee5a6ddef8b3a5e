//! `[store]`: where the marks live, one table per backend, and their defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration;
use super::tls::StoreTlsConfig;

/// Where the embedded store lives when the file names no path (relative to the working directory).
pub const DEFAULT_EMBEDDED_PATH: &str = "data/fencegate.db";
/// Most advances sent to the store together (one embedded commit and fsync, one PostgreSQL
/// statement, one Redis pipeline): bounds the latency a batch adds.
pub const DEFAULT_MAX_BATCH: usize = 512;
/// Keys whose mark the per-process lower-bound cache keeps: about 100 bytes each, ~10 MiB in all.
pub const DEFAULT_CACHE_CAPACITY: usize = 100_000;
/// The PostgreSQL schema fencegate's tables live in unless the file names another.
pub const DEFAULT_POSTGRES_SCHEMA: &str = "fencegate";
/// Connections in the PostgreSQL pool of one gateway.
pub const DEFAULT_POSTGRES_MAX_CONNECTIONS: u32 = 16;
/// How much longer than its holder's deadline a key's turn stays leased in a network store.
pub const DEFAULT_TURN_MARGIN: Duration = Duration::from_secs(5);
/// Batched advance statements each serving thread runs at once on PostgreSQL. Few, so that
/// concurrent advances wait for a turn and join a larger batch (the batch grows with the round
/// trip, as the embedded store's group commit does). Measured on 2 cores, c=64,
/// `ordering = "none"`, per-thread batchers: 1 gave 31k-37k req/s, 2 gave 30k-32k; with one
/// batcher for the whole gateway, before: 16 gave 10.5k, 4 gave 16.9k, 2 gave 15.2k-15.8k and 1
/// gave 20.7k-21.9k. More than one keeps other batches going while one statement is slow (a row
/// lock held by a stalled replica, say).
pub const DEFAULT_POSTGRES_BATCHES_IN_FLIGHT: usize = 1;
/// Prefix of fencegate's Redis keys unless the file names another.
pub const DEFAULT_REDIS_KEY_PREFIX: &str = "fencegate:";
/// Prefix of fencegate's etcd keys unless the file names another.
pub const DEFAULT_ETCD_KEY_PREFIX: &str = "fencegate/";
/// Most advances in one etcd transaction. etcd refuses a transaction with more operations than
/// its `--max-txn-ops` (128 by default) at any level, and a nested transaction may use only what
/// the levels above it left: each advance is one operation, its two nested levels of raise need
/// two each of what remains (the put and the fresh intent beside it), and that intent's begin
/// three (the record and two index entries): 128 - 4 - 3 = 121 is the most, and 120 leaves one
/// (`the_largest_advance_batch_fits_etcds_default_operation_limit` in `store/etcd/intents.rs`).
pub const DEFAULT_ETCD_MAX_BATCH: usize = 120;
/// How long one request to etcd may take before the gateway gives up on that endpoint.
pub const DEFAULT_ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// `[store]`: where high-water marks live, chosen by `backend`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "backend", rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreConfig {
    Embedded(EmbeddedStoreConfig),
    Postgres(PostgresStoreConfig),
    Redis(RedisStoreConfig),
    Etcd(EtcdStoreConfig),
}

impl StoreConfig {
    /// The short backend name used in logs and metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreConfig::Embedded(_) => "embedded",
            StoreConfig::Postgres(_) => "postgres",
            StoreConfig::Redis(_) => "redis",
            StoreConfig::Etcd(_) => "etcd",
        }
    }

    /// How many keys the per-process lower-bound cache holds.
    pub fn cache_capacity(&self) -> usize {
        match self {
            StoreConfig::Embedded(c) => c.cache_capacity,
            StoreConfig::Postgres(c) => c.cache_capacity,
            StoreConfig::Redis(c) => c.cache_capacity,
            StoreConfig::Etcd(c) => c.cache_capacity,
        }
    }

    /// How much longer than its forward can last a key's turn stays leased (network stores).
    pub fn turn_margin(&self) -> Duration {
        match self {
            StoreConfig::Embedded(_) => Duration::ZERO,
            StoreConfig::Postgres(c) => c.turn_margin,
            StoreConfig::Redis(c) => c.turn_margin,
            StoreConfig::Etcd(c) => c.turn_margin,
        }
    }

    /// Most advances sent to the store in one round trip / one commit.
    pub fn max_batch(&self) -> usize {
        match self {
            StoreConfig::Embedded(c) => c.max_batch,
            StoreConfig::Postgres(c) => c.max_batch,
            StoreConfig::Redis(c) => c.max_batch,
            StoreConfig::Etcd(c) => c.max_batch,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig::Embedded(EmbeddedStoreConfig::default())
    }
}

/// `[store] backend = "embedded"`: a local SQLite file in WAL mode with full sync.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedStoreConfig {
    #[serde(default = "default_embedded_path")]
    pub path: PathBuf,
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    #[serde(default = "default_cache_capacity")]
    pub cache_capacity: usize,
}

impl Default for EmbeddedStoreConfig {
    fn default() -> Self {
        EmbeddedStoreConfig {
            path: default_embedded_path(),
            max_batch: DEFAULT_MAX_BATCH,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
        }
    }
}

/// `[store] backend = "postgres"`: marks shared by every replica, advanced by one conditional
/// statement per batch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresStoreConfig {
    /// e.g. `postgres://postgres@127.0.0.1:5432/test`
    pub url: String,
    /// The schema holding fencegate's tables (created by the migrations).
    #[serde(default = "default_postgres_schema")]
    pub schema: String,
    #[serde(default = "default_postgres_max_connections")]
    pub max_connections: u32,
    /// Batched advance statements each serving thread runs at once (each on a connection of
    /// that thread's own), and batched mark reads running at once (on the pool).
    #[serde(default = "default_postgres_batches_in_flight")]
    pub batches_in_flight: usize,
    /// How much longer than its forward can last a key's turn stays leased in the store
    /// (`ordering = "serialize"`): a gateway frozen longer than this could outlive its lease.
    #[serde(default = "default_turn_margin", with = "duration")]
    pub turn_margin: Duration,
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    #[serde(default = "default_cache_capacity")]
    pub cache_capacity: usize,
    /// TLS to the server (or give `sslmode`, `sslrootcert`, `sslcert`, `sslkey` in the URL).
    #[serde(default)]
    pub tls: Option<StoreTlsConfig>,
}

/// `[store] backend = "redis"`: marks in Redis, advanced by a server-side script.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisStoreConfig {
    /// e.g. `redis://127.0.0.1:6379`, or `rediss://` for TLS.
    pub url: String,
    /// Prefix of every Redis key fencegate writes.
    #[serde(default = "default_redis_key_prefix")]
    pub key_prefix: String,
    /// Refuse to start when the server's persistence settings would lose marks on a restart.
    #[serde(default)]
    pub require_durable: bool,
    /// As for PostgreSQL: how much longer than its forward can last a key's turn stays leased.
    #[serde(default = "default_turn_margin", with = "duration")]
    pub turn_margin: Duration,
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    #[serde(default = "default_cache_capacity")]
    pub cache_capacity: usize,
    /// The CAs and client certificate for a `rediss://` URL (without it: the bundled web roots).
    #[serde(default)]
    pub tls: Option<StoreTlsConfig>,
}

/// `[store] backend = "etcd"`: marks in an etcd cluster (consensus: an accepted advance is on a
/// quorum's disks), compared and raised in one transaction per batch.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdStoreConfig {
    /// The cluster's client URLs, e.g. `["http://127.0.0.1:2379"]`, or `https://` for TLS. A
    /// request that cannot reach one endpoint goes to the next.
    pub endpoints: Vec<String>,
    /// Prefix of every etcd key fencegate writes.
    #[serde(default = "default_etcd_key_prefix")]
    pub key_prefix: String,
    /// A user of etcd's authentication, with `password_env` naming the environment variable
    /// that holds the password (never the password itself in the file).
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
    /// A file holding the password instead (a mounted secret).
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// How long one request may take before the endpoint counts as unreachable.
    #[serde(default = "default_etcd_request_timeout", with = "duration")]
    pub request_timeout: Duration,
    /// As for PostgreSQL: how much longer than its forward can last a key's turn stays leased.
    #[serde(default = "default_turn_margin", with = "duration")]
    pub turn_margin: Duration,
    /// Most advances in one transaction (at most the cluster's `--max-txn-ops`).
    #[serde(default = "default_etcd_max_batch")]
    pub max_batch: usize,
    #[serde(default = "default_cache_capacity")]
    pub cache_capacity: usize,
    /// The CAs and client certificate for `https://` endpoints (without it: the web roots).
    #[serde(default)]
    pub tls: Option<StoreTlsConfig>,
}

fn default_etcd_key_prefix() -> String {
    DEFAULT_ETCD_KEY_PREFIX.to_owned()
}
fn default_etcd_max_batch() -> usize {
    DEFAULT_ETCD_MAX_BATCH
}
fn default_etcd_request_timeout() -> Duration {
    DEFAULT_ETCD_REQUEST_TIMEOUT
}

fn default_embedded_path() -> PathBuf {
    PathBuf::from(DEFAULT_EMBEDDED_PATH)
}
fn default_max_batch() -> usize {
    DEFAULT_MAX_BATCH
}
fn default_cache_capacity() -> usize {
    DEFAULT_CACHE_CAPACITY
}
fn default_postgres_schema() -> String {
    DEFAULT_POSTGRES_SCHEMA.to_owned()
}
fn default_postgres_max_connections() -> u32 {
    DEFAULT_POSTGRES_MAX_CONNECTIONS
}
fn default_postgres_batches_in_flight() -> usize {
    DEFAULT_POSTGRES_BATCHES_IN_FLIGHT
}
fn default_turn_margin() -> Duration {
    DEFAULT_TURN_MARGIN
}
fn default_redis_key_prefix() -> String {
    DEFAULT_REDIS_KEY_PREFIX.to_owned()
}
