//! `[server]`: the data-plane listener's settings and their defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{byte_size, duration};

/// How long in-flight requests may run after a shutdown signal before connections are closed.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long the listener keeps serving after SIGTERM, with `/readyz` answering 503, before the
/// drain begins: time for load balancers to stop sending new clients here.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(5);
/// How often expired intent records are pruned.
pub const DEFAULT_INTENT_PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// How often the store's identity is re-checked while serving.
pub const DEFAULT_STORE_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Where the gateway keeps its own state unless the file names another directory.
pub const DEFAULT_STATE_DIR: &str = "data";
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

/// `[server]`: the data-plane listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    #[serde(default = "default_shutdown_grace", with = "duration")]
    pub shutdown_grace: Duration,
    /// After SIGTERM, how long the listener keeps serving with `/readyz` answering 503 before the
    /// drain (`shutdown_grace`) begins; a second SIGTERM or SIGINT cuts it short.
    #[serde(default = "default_drain_delay", with = "duration::zero_allowed")]
    pub drain_delay: Duration,
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
    /// Terminate TLS on the listener (ALPN `h2` and `http/1.1`); absent: plain HTTP.
    #[serde(default)]
    pub tls: Option<super::ListenerTlsConfig>,
    /// One structured line per request (target `fencegate::access`, level info).
    #[serde(default = "default_access_log")]
    pub access_log: bool,
    /// The share of ordinary requests the access log keeps, 0.0 to 1.0; refusals and 5xx
    /// answers are always written.
    #[serde(default = "default_access_log_sample")]
    pub access_log_sample: f64,
    /// How each access line is written: structured fields, or nginx's `combined` line.
    #[serde(default)]
    pub access_log_format: AccessLogFormat,
}

/// The access line's shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    /// Structured fields: text or flat JSON, as `--log-format` says.
    #[default]
    Fields,
    /// nginx's `combined` line (client, time, request line, status, bytes, referer, user
    /// agent), then the gateway's own fields as `name=value`, as the line's message.
    Combined,
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

fn default_access_log() -> bool {
    true
}
fn default_access_log_sample() -> f64 {
    1.0
}
fn default_shutdown_grace() -> Duration {
    DEFAULT_SHUTDOWN_GRACE
}
fn default_drain_delay() -> Duration {
    DEFAULT_DRAIN_DELAY
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
