//! `[routes.fence.authority]`: the lock service a route's tokens come from, which the gateway
//! watches so that a grant raises the key's mark at once and an ended lease stops its holder.

use std::time::Duration;

use serde::Deserialize;

use super::{duration, StoreTlsConfig};

/// How long one request to the lock service may take (a confirm, a poll, a watch's start).
pub const DEFAULT_AUTHORITY_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the PostgreSQL lease table is read.
pub const DEFAULT_LEASE_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The lease table of docs/getting-tokens.md.
pub const DEFAULT_LEASE_TABLE: &str = "lock_leases";
/// The ZooKeeper session the gateway follows the locks with: a break shorter than this keeps it.
pub const DEFAULT_ZOOKEEPER_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// `[routes.fence.authority]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AuthorityConfig {
    pub kind: AuthorityKind,
    /// The lock's name, with `{name}` placeholders for what varies (`locks/invoice/{id}`). On
    /// etcd, the contenders' keys sit one level below it (`locks/invoice/42/<lease>`), or the
    /// lock is that one key; on PostgreSQL it is the lease row's `lock_key`; on ZooKeeper it is
    /// the lock node's path (`/locks/invoice/{id}`), the contenders its children.
    pub lock_key: String,
    /// The resource key a lock guards, from the lock key's placeholders (`invoice:{id}`);
    /// absent: the route's own `resource_key`, which then may use only those placeholders.
    #[serde(default)]
    pub resource_key: Option<String>,
    /// Refuse a write whose token is not the lock's current holder (409 lease-ended).
    #[serde(default)]
    pub require_live_lease: bool,
    /// Confirm the holder with a linearizable read of the lock service before forwarding
    /// (batched across requests); needs `require_live_lease`.
    #[serde(default)]
    pub strict: bool,
    #[serde(default)]
    pub on_unavailable: OnAuthorityUnavailable,
    #[serde(default = "default_timeout", with = "duration")]
    pub request_timeout: Duration,
    /// etcd: the cluster's client URLs.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// etcd: a user of etcd's authentication; ZooKeeper: a user of its digest scheme; and the
    /// variable holding its password.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
    /// A file holding the password instead (a mounted secret).
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// etcd: CAs and client certificate for `https://` endpoints.
    #[serde(default)]
    pub tls: Option<StoreTlsConfig>,
    /// PostgreSQL: the connection URL of the database holding the lease table.
    #[serde(default)]
    pub url: Option<String>,
    /// PostgreSQL: the lease table, `(lock_key, owner, fence, expires_at)`.
    #[serde(default = "default_table")]
    pub table: String,
    /// PostgreSQL: how often the lease table is read.
    #[serde(default = "default_poll_interval", with = "duration")]
    pub poll_interval: Duration,
    /// ZooKeeper: the ensemble's connect string, `host:port[,host:port...][/chroot]`.
    #[serde(default)]
    pub hosts: Option<String>,
    /// ZooKeeper: what a holder's token is (default: its sequence number).
    #[serde(default)]
    pub token: Option<ZookeeperToken>,
    /// ZooKeeper: the timeout of the gateway's own session (default
    /// [`DEFAULT_ZOOKEEPER_SESSION_TIMEOUT`]).
    #[serde(default, with = "duration::optional")]
    pub session_timeout: Option<Duration>,
}

/// ZooKeeper: which number of the holder's node is its fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ZookeeperToken {
    /// The node's sequence number, from the lock node's own counter (`lock-0000000007`: 7).
    #[default]
    Sequence,
    /// The transaction id that created the node: ensemble-wide, it survives a lock node deleted
    /// and made again.
    Czxid,
}

/// Which lock service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthorityKind {
    /// Locks as etcd's own recipe takes them: the token is the holder key's create revision.
    Etcd,
    /// The lease table of the reference design: the token is the row's `fence`.
    Postgres,
    /// ZooKeeper's lock recipe (and Curator's `InterProcessMutex`): the token is the holder
    /// node's sequence number or czxid.
    Zookeeper,
}

/// What a route does while the gateway cannot follow the lock service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnAuthorityUnavailable {
    /// Refuse fenced writes with 503.
    #[default]
    FailClosed,
    /// Fence by the marks alone, as a route without an authority does.
    Plain,
}

fn default_timeout() -> Duration {
    DEFAULT_AUTHORITY_TIMEOUT
}
fn default_poll_interval() -> Duration {
    DEFAULT_LEASE_POLL_INTERVAL
}
fn default_table() -> String {
    DEFAULT_LEASE_TABLE.to_owned()
}
