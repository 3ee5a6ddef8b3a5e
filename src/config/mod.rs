//! The configuration file's shape: what an operator may write, with defaults, exactly as it
//! deserializes from TOML. Loading and validation live in `load.rs`; durations in `duration.rs`.

mod byte_size;
mod duration;
mod error;
mod load;

pub use error::ConfigError;
pub use load::{load_file, parse_str};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Default header carrying the fencing token (docs/design.md §3).
pub const DEFAULT_FENCE_HEADER: &str = "X-Fence";
/// Default header carrying the lock authority's signature of key and token.
pub const DEFAULT_SIGNATURE_HEADER: &str = "X-Fence-Signature";
/// How long a client may wait for the upstream's response head before it gets 504: long enough for a
/// slow legacy service, short enough that a hung upstream does not pin connections for minutes.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a fenced request waits for the store before it is refused with 503 (fail closed, I5).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an admitted request waits for its turn at the per-key gate before 503: several
/// typical upstream round trips, well under a client's own timeout.
pub const DEFAULT_GATE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default header carrying the idempotency key (the IETF httpapi draft's name).
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// How long outcomes are kept and replayed unless the route says otherwise (Stripe keeps 24 h).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Response bodies up to this size are stored for replay.
pub const DEFAULT_MAX_STORED_BODY: usize = 64 * 1024;
/// Request bodies up to this size are accepted on idempotent routes.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;
/// How long in-flight requests may run after a shutdown signal before connections are closed.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How often expired intent records are pruned.
pub const DEFAULT_INTENT_PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// How often the store's identity is re-checked while serving.
pub const DEFAULT_STORE_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Where the gateway keeps its own state unless the file names another directory.
pub const DEFAULT_STATE_DIR: &str = "data";
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
/// Largest request body a route forwards unless it says otherwise (413 above): generous for API
/// writes, small enough that one client cannot tie up the upstream with an endless upload.
pub const DEFAULT_MAX_BODY: usize = 10 * 1024 * 1024;
/// Client connections served at once; more are answered 503 and closed. Well under a typical
/// 65536 open-file limit, leaving room for upstream and store connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Largest HTTP/1.1 request head (request line plus headers) and HTTP/2 header list; 431 above.
/// Browsers and API clients stay well under 16 KiB; 64 KiB leaves room for large tokens.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Smallest `max_header_bytes` accepted: hyper's HTTP/1.1 read buffer cannot be smaller.
pub const MIN_MAX_HEADER_BYTES: usize = 8 * 1024;
/// Most header fields in one HTTP/1.1 request; 431 above (hyper's own default).
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// How long a new connection may stay silent (not one byte) before it is closed.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a kept-alive HTTP/1.1 connection may wait between requests, and an HTTP/2 connection
/// stay without an open stream, before it is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request head (or the HTTP/2 preface) may take from its first byte to its end.
pub const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest pause between two pieces of a client's request body (408 after it).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a response may wait for a client that does not read it before the connection closes.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// HTTP/2 streams one client connection may have open at once.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;
/// Open connections to one upstream (host and port), for the whole process.
pub const DEFAULT_MAX_UPSTREAM_CONNECTIONS: usize = 256;
/// How long a request waits for a free upstream connection before 503 `upstream-busy`.
pub const DEFAULT_UPSTREAM_CONNECTION_WAIT: Duration = Duration::from_secs(1);
/// The process-wide budget for bodies the gateway holds in memory.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 256 * 1024 * 1024;
/// How long a request waits for room in that budget before 503 `memory-busy`.
pub const DEFAULT_BUFFER_WAIT: Duration = Duration::from_secs(1);
/// Admin connections served at once.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
/// How much of a serialized write's response is read ahead so that its key's turn can end when
/// the upstream is done, whatever the client does.
pub const DEFAULT_RESPONSE_READ_AHEAD: usize = 1024 * 1024;

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
}

/// `[admin]`: metrics, health and the admin API on their own address.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// The bearer token the admin endpoints require (prefer `token_env`).
    #[serde(default)]
    pub token: Option<String>,
    /// Name of an environment variable holding the token, read at start.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Require the token on `/metrics`, `/healthz` and `/readyz` too.
    #[serde(default)]
    pub probes_require_token: bool,
    /// Admin connections served at once; more are answered 503 and closed. The `[server]`
    /// connection timeouts apply here too.
    #[serde(default = "default_admin_max_connections")]
    pub max_connections: usize,
}

/// `[server]`: the data-plane listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    #[serde(default = "default_shutdown_grace", with = "duration")]
    pub shutdown_grace: Duration,
    /// The gateway's own small state (the record of the store it adopted), relative to the
    /// working directory. Each replica needs its own, kept across restarts.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// How often the gateway re-reads the store's identity (to notice a store wiped while running,
    /// and an operator's adoption).
    #[serde(default = "default_store_check_interval", with = "duration")]
    pub store_check_interval: Duration,
    /// How often intent records past their retention are deleted (in batches).
    #[serde(default = "default_intent_prune_interval", with = "duration")]
    pub intent_prune_interval: Duration,
    /// Client connections served at once; a connection over the limit is answered 503 and closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Largest request head (HTTP/1.1) or header list (HTTP/2), in bytes; 431 above.
    #[serde(default = "default_max_header_bytes", with = "byte_size")]
    pub max_header_bytes: usize,
    /// Most header fields in one HTTP/1.1 request; 431 above.
    #[serde(default = "default_max_headers")]
    pub max_headers: usize,
    /// Threads serving client connections, each a single-threaded runtime with its own upstream
    /// connection pool; 0: one per core.
    #[serde(default)]
    pub workers: usize,
    /// A new connection that sends nothing at all for this long is closed.
    #[serde(default = "default_first_byte_timeout", with = "duration")]
    pub first_byte_timeout: Duration,
    /// A kept-alive HTTP/1.1 connection between requests, or an HTTP/2 connection with no open
    /// stream (pings and settings do not count), is closed after this long.
    #[serde(default = "default_idle_timeout", with = "duration")]
    pub idle_timeout: Duration,
    /// Longest time from the first byte of a request head (or the HTTP/2 preface) to its end.
    #[serde(default = "default_head_timeout", with = "duration")]
    pub head_timeout: Duration,
    /// Longest pause between two pieces of a client's request body; 408 after it.
    #[serde(default = "default_body_timeout", with = "duration")]
    pub body_timeout: Duration,
    /// A response the client makes no progress reading for this long closes its connection.
    #[serde(default = "default_write_timeout", with = "duration")]
    pub write_timeout: Duration,
    /// HTTP/2 streams one client connection may have open at once.
    #[serde(default = "default_max_concurrent_streams")]
    pub max_concurrent_streams: u32,
    /// Open connections to one upstream (host and port), for the whole process; a route may set
    /// a smaller cap of its own.
    #[serde(default = "default_max_upstream_connections")]
    pub max_upstream_connections: usize,
    /// How long a request waits for a free upstream connection before 503 `upstream-busy`.
    #[serde(default = "default_upstream_connection_wait", with = "duration")]
    pub upstream_connection_wait: Duration,
    /// The process-wide budget for bodies held in memory: idempotent routes' request bodies,
    /// captured responses, serialized responses read ahead.
    #[serde(default = "default_max_buffered_bytes", with = "byte_size")]
    pub max_buffered_bytes: usize,
    /// How long a request waits for room in that budget before 503 `memory-busy`.
    #[serde(default = "default_buffer_wait", with = "duration")]
    pub buffer_wait: Duration,
}

impl ServerConfig {
    /// The number of serving threads: `workers`, or one per core when it is 0.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        }
    }
}

/// `[store]`: where high-water marks live, chosen by `backend`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "backend", rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreConfig {
    Embedded(EmbeddedStoreConfig),
    Postgres(PostgresStoreConfig),
    Redis(RedisStoreConfig),
}

impl StoreConfig {
    /// The short backend name used in logs and metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreConfig::Embedded(_) => "embedded",
            StoreConfig::Postgres(_) => "postgres",
            StoreConfig::Redis(_) => "redis",
        }
    }

    /// How many keys the per-process lower-bound cache holds.
    pub fn cache_capacity(&self) -> usize {
        match self {
            StoreConfig::Embedded(c) => c.cache_capacity,
            StoreConfig::Postgres(c) => c.cache_capacity,
            StoreConfig::Redis(c) => c.cache_capacity,
        }
    }

    /// How much longer than its forward can last a key's turn stays leased (network stores).
    pub fn turn_margin(&self) -> Duration {
        match self {
            StoreConfig::Embedded(_) => Duration::ZERO,
            StoreConfig::Postgres(c) => c.turn_margin,
            StoreConfig::Redis(c) => c.turn_margin,
        }
    }

    /// Most advances sent to the store in one round trip / one commit.
    pub fn max_batch(&self) -> usize {
        match self {
            StoreConfig::Embedded(c) => c.max_batch,
            StoreConfig::Postgres(c) => c.max_batch,
            StoreConfig::Redis(c) => c.max_batch,
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
}

/// `[store] backend = "redis"`: marks in Redis, advanced by a server-side script.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisStoreConfig {
    /// e.g. `redis://127.0.0.1:6379`
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
}

/// `[[routes]]`: one path pattern in front of one upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub name: String,
    pub path: String,
    /// The fenced methods; absent: every method but GET, HEAD, OPTIONS and TRACE.
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    /// Compare the path's literal segments with the request's exactly; by default they compare
    /// ASCII-case-insensitively (fencing a case-sensitive upstream more than needed is harmless).
    #[serde(default)]
    pub case_sensitive: bool,
    /// A request path with `;` parameters on this route: refused, or stripped before matching
    /// and forwarding.
    #[serde(default)]
    pub path_parameters: PathParameters,
    /// A last path segment with a `.suffix` on this route (`/invoices/7.json`), which Rails and
    /// older Spring read as a format of `/invoices/7`: refused, or read literally.
    #[serde(default)]
    pub format_suffix: FormatSuffix,
    /// DELETE or MOVE of a path this `{*rest}` route matches, or MOVE/COPY onto one, which acts
    /// on a whole collection when the path is one: refused, or allowed (the upstream has no
    /// collections below this route).
    #[serde(default)]
    pub collection_writes: CollectionWrites,
    pub upstream: String,
    #[serde(default)]
    pub resource_key: Option<String>,
    #[serde(default = "default_upstream_timeout", with = "duration")]
    pub timeout: Duration,
    /// Keep the client's `Forwarded` / `X-Forwarded-*` headers and append to them (only behind a
    /// trusted proxy); by default they are replaced.
    #[serde(default)]
    pub trust_forwarded: bool,
    /// Send the client's `Host` upstream instead of the upstream's own authority.
    #[serde(default)]
    pub preserve_host: bool,
    /// Largest request body forwarded; 413 above (at once when `Content-Length` says so).
    #[serde(default = "default_max_body", with = "byte_size")]
    pub max_body: usize,
    /// Open connections to this route's upstream; the smallest of `[server]`'s and those of the
    /// routes naming the same host and port applies.
    #[serde(default)]
    pub max_upstream_connections: Option<usize>,
    #[serde(default)]
    pub fence: FenceConfig,
    /// Idempotency keys and intent records for a provider that cannot be fenced.
    #[serde(default)]
    pub idempotency: Option<IdempotencyConfig>,
}

/// `[routes.idempotency]`: the same key on every attempt, and a durable intent before the call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyConfig {
    /// The header the provider expects.
    #[serde(default = "default_idempotency_header")]
    pub header: String,
    /// Template of the key: `{resource_key}`, `{method}`, `{route}`, path segments, `{header:..}`,
    /// `{query:..}`. Never the fence, the holder or the time: every attempt sends the same key.
    pub key: String,
    /// Name of an environment variable holding a secret: send HMAC-SHA256(secret, key) instead.
    #[serde(default)]
    pub hmac_secret_env: Option<String>,
    #[serde(default)]
    pub client_key: ClientKey,
    /// How long outcomes are kept and replayed.
    #[serde(default = "default_retention", with = "duration")]
    pub retention: Duration,
    /// Largest response body stored for replay; longer ones are stored without their body.
    #[serde(default = "default_max_stored_body", with = "byte_size")]
    pub max_stored_body: usize,
    /// Largest request body accepted (it is read whole to fingerprint the request); 413 above.
    #[serde(default = "default_max_request_body", with = "byte_size")]
    pub max_request_body: usize,
    /// Response headers stored and replayed with the outcome.
    #[serde(default = "default_stored_headers")]
    pub stored_headers: Vec<String>,
}

/// What happens to an idempotency key the client sent itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientKey {
    /// Ignore it and send the derived key.
    #[default]
    Replace,
    /// Use the client's key when it sent one, else the derived key.
    Keep,
    /// The client must send one (400 otherwise); it is used as is.
    Require,
}

/// `[routes.fence]`: how a route checks tokens.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceConfig {
    #[serde(default = "default_fence_header")]
    pub header: String,
    #[serde(default)]
    pub mode: FenceMode,
    #[serde(default)]
    pub compare: Compare,
    #[serde(default = "default_store_timeout", with = "duration")]
    pub store_timeout: Duration,
    #[serde(default)]
    pub on_store_error: OnStoreError,
    #[serde(default)]
    pub ordering: Ordering,
    /// How long an admitted request may wait for its key's earlier writes before 503.
    #[serde(default = "default_gate_timeout", with = "duration")]
    pub gate_timeout: Duration,
    /// Refuse a token more than this far above the key's current mark (0 for a new key), so a
    /// client cannot poison a key with a huge token; absent: no limit.
    #[serde(default)]
    pub max_advance: Option<u64>,
    /// Name of an environment variable holding the secret the lock authority signs tokens with;
    /// when set, unsigned or badly signed tokens are refused.
    #[serde(default)]
    pub signature_secret_env: Option<String>,
    /// The header carrying the signature (lower-case hex HMAC-SHA256 of `key\ntoken`).
    #[serde(default = "default_signature_header")]
    pub signature_header: String,
    /// With `ordering = "serialize"`: this much of the upstream's response is read ahead, so that
    /// when all of it fits the key's turn ends once the upstream is done.
    #[serde(default = "default_response_read_ahead", with = "byte_size")]
    pub response_read_ahead: usize,
}

impl Default for FenceConfig {
    fn default() -> Self {
        FenceConfig {
            header: default_fence_header(),
            mode: FenceMode::default(),
            compare: Compare::default(),
            store_timeout: DEFAULT_STORE_TIMEOUT,
            on_store_error: OnStoreError::default(),
            ordering: Ordering::default(),
            gate_timeout: DEFAULT_GATE_TIMEOUT,
            max_advance: None,
            signature_secret_env: None,
            signature_header: default_signature_header(),
            response_read_ahead: DEFAULT_RESPONSE_READ_AHEAD,
        }
    }
}

/// What a route does with `;` path parameters, which Tomcat and Spring strip before routing while
/// other upstreams keep them as part of the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PathParameters {
    /// 400 `invalid-path` when the route guards the request's method.
    #[default]
    Refuse,
    /// Remove every segment's parameters, then match, key and forward the path without them.
    Strip,
}

/// What a route does with a `.suffix` in a request's last path segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatSuffix {
    /// 400 `invalid-path` when the route guards the method and the path without the suffix is
    /// another resource of a guarded route.
    #[default]
    Refuse,
    /// The suffix is part of the segment (file names, dotted identifiers).
    Literal,
}

/// What a `{*rest}` route does with writes that may act on a whole collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectionWrites {
    /// 403 `fenced-collection`: each resource below has a key of its own.
    #[default]
    Refuse,
    /// The upstream has no collections below this route.
    Allow,
}

/// Whether writes of one key may be in flight to the upstream together (I4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// At most one forwarded write per key at a time, in admission order.
    #[default]
    Serialize,
    /// Admitted writes are forwarded at once, possibly overlapping.
    None,
}

/// What a fenced request does when the store fails or times out (I5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// Refuse with 503: nothing unchecked reaches the upstream.
    #[default]
    FailClosed,
    /// Forward unchecked, and count it: availability over fencing, by explicit choice.
    FailOpen,
}

/// What a route does with tokens (docs/design.md §2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceMode {
    /// Refuse what fails the check.
    #[default]
    Enforce,
    /// Forward everything; count and log what enforce would refuse.
    Observe,
    /// A plain proxy route.
    Off,
}

/// Which tokens pass against a key's high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compare {
    /// `token >= mark`: one holder may write several times with one token.
    #[default]
    Monotonic,
    /// `token > mark`: every write needs a new generation.
    Strict,
}

fn default_shutdown_grace() -> Duration {
    DEFAULT_SHUTDOWN_GRACE
}
fn default_intent_prune_interval() -> Duration {
    DEFAULT_INTENT_PRUNE_INTERVAL
}
fn default_store_check_interval() -> Duration {
    DEFAULT_STORE_CHECK_INTERVAL
}
fn default_state_dir() -> PathBuf {
    PathBuf::from(DEFAULT_STATE_DIR)
}
fn default_max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}
fn default_max_header_bytes() -> usize {
    DEFAULT_MAX_HEADER_BYTES
}
fn default_max_headers() -> usize {
    DEFAULT_MAX_HEADERS
}
fn default_max_body() -> usize {
    DEFAULT_MAX_BODY
}
fn default_upstream_timeout() -> Duration {
    DEFAULT_UPSTREAM_TIMEOUT
}
fn default_idempotency_header() -> String {
    DEFAULT_IDEMPOTENCY_HEADER.to_owned()
}
fn default_retention() -> Duration {
    DEFAULT_RETENTION
}
fn default_max_stored_body() -> usize {
    DEFAULT_MAX_STORED_BODY
}
fn default_max_request_body() -> usize {
    DEFAULT_MAX_REQUEST_BODY
}
fn default_stored_headers() -> Vec<String> {
    vec!["content-type".to_owned(), "location".to_owned()]
}
fn default_gate_timeout() -> Duration {
    DEFAULT_GATE_TIMEOUT
}
fn default_store_timeout() -> Duration {
    DEFAULT_STORE_TIMEOUT
}
fn default_fence_header() -> String {
    DEFAULT_FENCE_HEADER.to_owned()
}
fn default_signature_header() -> String {
    DEFAULT_SIGNATURE_HEADER.to_owned()
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
fn default_first_byte_timeout() -> Duration {
    DEFAULT_FIRST_BYTE_TIMEOUT
}
fn default_idle_timeout() -> Duration {
    DEFAULT_IDLE_TIMEOUT
}
fn default_head_timeout() -> Duration {
    DEFAULT_HEAD_TIMEOUT
}
fn default_body_timeout() -> Duration {
    DEFAULT_BODY_TIMEOUT
}
fn default_write_timeout() -> Duration {
    DEFAULT_WRITE_TIMEOUT
}
fn default_max_concurrent_streams() -> u32 {
    DEFAULT_MAX_CONCURRENT_STREAMS
}
fn default_max_upstream_connections() -> usize {
    DEFAULT_MAX_UPSTREAM_CONNECTIONS
}
fn default_upstream_connection_wait() -> Duration {
    DEFAULT_UPSTREAM_CONNECTION_WAIT
}
fn default_max_buffered_bytes() -> usize {
    DEFAULT_MAX_BUFFERED_BYTES
}
fn default_buffer_wait() -> Duration {
    DEFAULT_BUFFER_WAIT
}
fn default_admin_max_connections() -> usize {
    DEFAULT_ADMIN_MAX_CONNECTIONS
}
fn default_response_read_ahead() -> usize {
    DEFAULT_RESPONSE_READ_AHEAD
}
