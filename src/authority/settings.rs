//! `[routes.fence.authority]` checked and compiled once, when the routes are: the lock mapping,
//! how to reach the lock service, and what the route does with what it learns.

use std::time::Duration;

use crate::config::{
    AuthorityConfig, AuthorityKind, EtcdStoreConfig, OnAuthorityUnavailable, ZookeeperToken,
    DEFAULT_CACHE_CAPACITY, DEFAULT_ETCD_MAX_BATCH, DEFAULT_TURN_MARGIN,
    DEFAULT_ZOOKEEPER_SESSION_TIMEOUT,
};

use super::mapping::{LockMapping, MappingError};
use crate::input_type::InputType;

/// How to reach the lock service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Service {
    /// An etcd cluster, with the password read from its variable or file.
    Etcd {
        client: Box<EtcdStoreConfig>,
        password: Option<String>,
    },
    /// A PostgreSQL lease table.
    Postgres {
        url: String,
        table: String,
        poll_interval: Duration,
    },
    /// A ZooKeeper ensemble, with the `user:password` of ZooKeeper's digest scheme if it needs one.
    Zookeeper {
        hosts: String,
        token: ZookeeperToken,
        session_timeout: Duration,
        digest: Option<Digest>,
    },
}

/// A route's authority, compiled. Two routes with equal settings share one watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthoritySettings {
    pub mapping: LockMapping,
    pub service: Service,
    pub require_live_lease: bool,
    pub strict: bool,
    pub on_unavailable: OnAuthorityUnavailable,
    pub request_timeout: Duration,
}

impl AuthoritySettings {
    /// Compiles `config`; `route_resource_key` is the route's own template, the default of
    /// `resource_key`, and `path_type` the type the route's path gives a placeholder.
    pub fn compile(
        config: &AuthorityConfig,
        route_resource_key: Option<&str>,
        path_type: impl Fn(&str) -> InputType,
    ) -> Result<AuthoritySettings, MappingError> {
        let fail = |field: &'static str, message: &str| MappingError {
            field,
            message: message.to_owned(),
        };
        let resource_key = match (&config.resource_key, route_resource_key) {
            (Some(template), _) => template.as_str(),
            (None, Some(template)) => template,
            (None, None) => {
                return Err(fail(
                    "fence.authority.resource_key",
                    "required: the route has no resource_key to default to",
                ))
            }
        };
        let mapping = LockMapping::parse_typed(&config.lock_key, resource_key, path_type).map_err(|e| {
            if config.resource_key.is_none() && e.field == "fence.authority.resource_key" {
                MappingError {
                    field: e.field,
                    message: format!("not set, so the route's resource_key is used: {e}; set resource_key here to say which resource key a lock guards"),
                }
            } else {
                e
            }
        })?;
        if config.strict && !config.require_live_lease {
            return Err(fail(
                "fence.authority.strict",
                "confirms the holder of a live lease, so it needs require_live_lease = true",
            ));
        }
        if config.request_timeout.is_zero() {
            return Err(fail(
                "fence.authority.request_timeout",
                "must be above zero",
            ));
        }
        let service = match config.kind {
            AuthorityKind::Etcd => etcd_service(config)?,
            AuthorityKind::Postgres => postgres_service(config)?,
            AuthorityKind::Zookeeper => zookeeper_service(config)?,
        };
        Ok(AuthoritySettings {
            mapping,
            service,
            require_live_lease: config.require_live_lease,
            strict: config.strict,
            on_unavailable: config.on_unavailable,
            request_timeout: config.request_timeout,
        })
    }

    pub fn kind(&self) -> &'static str {
        match self.service {
            Service::Etcd { .. } => "etcd",
            Service::Postgres { .. } => "postgres",
            Service::Zookeeper { .. } => "zookeeper",
        }
    }
}

fn etcd_service(config: &AuthorityConfig) -> Result<Service, MappingError> {
    let fail = |field: &'static str, message: String| MappingError { field, message };
    if config.url.is_some() {
        return Err(fail(
            "fence.authority.url",
            "PostgreSQL only: etcd is reached at `endpoints`".to_owned(),
        ));
    }
    refuse_zookeeper_fields(config, "etcd")?;
    if config.endpoints.is_empty() {
        return Err(fail(
            "fence.authority.endpoints",
            "name at least one client URL, e.g. \"http://127.0.0.1:2379\"".to_owned(),
        ));
    }
    if !config
        .endpoints
        .iter()
        .all(|e| e.starts_with("http://") || e.starts_with("https://"))
    {
        return Err(fail(
            "fence.authority.endpoints",
            "each endpoint is an http:// or https:// URL".to_owned(),
        ));
    }
    let password = credentials(config)?.map(|(_, password)| password);
    let client = EtcdStoreConfig {
        endpoints: config.endpoints.clone(),
        key_prefix: String::new(),
        username: config.username.clone(),
        password_env: config.password_env.clone(),
        password_file: config.password_file.clone(),
        request_timeout: config.request_timeout,
        turn_margin: DEFAULT_TURN_MARGIN,
        max_batch: DEFAULT_ETCD_MAX_BATCH,
        cache_capacity: DEFAULT_CACHE_CAPACITY,
        tls: config.tls.clone(),
    };
    #[cfg(feature = "etcd")]
    crate::etcd::client::check_tls(&client).map_err(|e| {
        let field = match e.field {
            "tls.ca_file" => "fence.authority.tls.ca_file",
            "tls.client_cert" => "fence.authority.tls.client_cert",
            "tls.client_key" => "fence.authority.tls.client_key",
            _ => "fence.authority.tls",
        };
        fail(field, e.message)
    })?;
    Ok(Service::Etcd {
        client: Box::new(client),
        password,
    })
}

fn postgres_service(config: &AuthorityConfig) -> Result<Service, MappingError> {
    let fail = |field: &'static str, message: &str| MappingError {
        field,
        message: message.to_owned(),
    };
    let Some(url) = &config.url else {
        return Err(fail(
            "fence.authority.url",
            "the PostgreSQL database holding the lease table, e.g. \"postgres://locks@db/app\"",
        ));
    };
    refuse_zookeeper_fields(config, "PostgreSQL")?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(fail(
            "fence.authority.url",
            "a postgres:// or postgresql:// URL",
        ));
    }
    if !config.endpoints.is_empty()
        || config.username.is_some()
        || config.password_env.is_some()
        || config.password_file.is_some()
        || config.tls.is_some()
    {
        return Err(fail(
            "fence.authority.endpoints",
            "etcd only: endpoints, username, password_env, password_file and tls; PostgreSQL takes them in `url`",
        ));
    }
    let identifier = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !part.as_bytes()[0].is_ascii_digit()
    };
    if !config.table.split('.').all(identifier) || config.table.split('.').count() > 2 {
        return Err(fail(
            "fence.authority.table",
            "a lower-case table name, optionally schema-qualified (lock_leases, locks.lock_leases)",
        ));
    }
    if config.poll_interval < Duration::from_millis(10) {
        return Err(fail("fence.authority.poll_interval", "at least 10ms"));
    }
    Ok(Service::Postgres {
        url: url.clone(),
        table: config.table.clone(),
        poll_interval: config.poll_interval,
    })
}

/// `hosts`, `token` and `session_timeout` belong to a ZooKeeper authority only.
fn refuse_zookeeper_fields(config: &AuthorityConfig, kind: &str) -> Result<(), MappingError> {
    let field = if config.hosts.is_some() {
        "fence.authority.hosts"
    } else if config.token.is_some() {
        "fence.authority.token"
    } else if config.session_timeout.is_some() {
        "fence.authority.session_timeout"
    } else {
        return Ok(());
    };
    Err(MappingError {
        field,
        message: format!("ZooKeeper only; a {kind} authority does not take it"),
    })
}

fn zookeeper_service(config: &AuthorityConfig) -> Result<Service, MappingError> {
    let fail = |field: &'static str, message: &str| MappingError {
        field,
        message: message.to_owned(),
    };
    for (set, field) in [
        (config.url.is_some(), "fence.authority.url"),
        (!config.endpoints.is_empty(), "fence.authority.endpoints"),
        (config.tls.is_some(), "fence.authority.tls"),
    ] {
        if set {
            return Err(fail(
                field,
                "not for ZooKeeper, which is reached at `hosts` (no TLS)",
            ));
        }
    }
    let Some(hosts) = config.hosts.as_deref() else {
        return Err(fail(
            "fence.authority.hosts",
            "the ensemble's connect string, e.g. \"zk1:2181,zk2:2181,zk3:2181\" (a /chroot may follow)",
        ));
    };
    let hosts = connect_string(hosts).map_err(|message| fail("fence.authority.hosts", message))?;
    if !is_zookeeper_path(&config.lock_key) {
        return Err(fail(
            "fence.authority.lock_key",
            "a ZooKeeper path: it starts with /, and no segment is empty, . or .., e.g. \"/locks/invoice/{id}\"",
        ));
    }
    let session_timeout = config
        .session_timeout
        .unwrap_or(DEFAULT_ZOOKEEPER_SESSION_TIMEOUT);
    if session_timeout < Duration::from_secs(1) {
        return Err(fail("fence.authority.session_timeout", "at least 1s"));
    }
    Ok(Service::Zookeeper {
        hosts,
        token: config.token.unwrap_or_default(),
        session_timeout,
        digest: zookeeper_digest(config)?.map(Digest),
    })
}

/// `hosts` checked and written without spaces: `host:port` pairs (an IPv6 host in brackets), a
/// port on each (ZooKeeper's client would default it; here it is said), an optional chroot.
fn connect_string(hosts: &str) -> Result<String, &'static str> {
    const SHAPE: &str =
        "host:port pairs separated by commas, e.g. \"zk1:2181,zk2:2181\", a /chroot after them if any";
    let (servers, chroot) = match hosts.trim().split_once('/') {
        Some((servers, chroot)) => (servers, Some(format!("/{chroot}"))),
        None => (hosts.trim(), None),
    };
    let mut checked = Vec::new();
    for server in servers.split(',').map(str::trim) {
        let (host, port) = server.rsplit_once(':').ok_or(SHAPE)?;
        let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
        let plain = !host.is_empty() && !host.contains([':', ' ', '[', ']']);
        if !(bracketed || plain) || !port.parse::<u16>().is_ok_and(|p| p > 0) {
            return Err(SHAPE);
        }
        checked.push(server);
    }
    if let Some(chroot) = &chroot {
        if !is_zookeeper_path(chroot) {
            return Err("the chroot after the servers is a ZooKeeper path with no empty, . or .. segment, e.g. \"zk1:2181/apps\"");
        }
    }
    Ok(format!(
        "{}{}",
        checked.join(","),
        chroot.unwrap_or_default()
    ))
}

/// Whether `path` is one ZooKeeper accepts: absolute, and no segment empty, `.` or `..` (a
/// placeholder's values are checked where a request names them: a lock no node can have).
fn is_zookeeper_path(path: &str) -> bool {
    path.strip_prefix('/').is_some_and(|rest| {
        rest.split('/')
            .all(|segment| !matches!(segment, "" | "." | ".."))
    })
}

/// ZooKeeper's digest credentials, `user:password`; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Digest(pub String);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Digest(..)")
    }
}

/// `username` and the password read from `password_env` or `password_file`, both or neither.
fn credentials(config: &AuthorityConfig) -> Result<Option<(String, String)>, MappingError> {
    let fail = |field: &'static str, message: &str| MappingError {
        field,
        message: message.to_owned(),
    };
    let password_field = if config.password_file.is_some() {
        "fence.authority.password_file"
    } else {
        "fence.authority.password_env"
    };
    let password = crate::config::secret::read_allowing_empty(
        "password",
        config.password_env.as_deref(),
        config.password_file.as_deref(),
    )
    .map_err(|e| fail(password_field, &e.to_string()))?;
    match (&config.username, password) {
        (None, None) => Ok(None),
        (Some(user), Some(password)) => Ok(Some((user.clone(), password))),
        (Some(_), None) => Err(fail(
            "fence.authority.password_env",
            "a username needs the variable (or password_file) holding its password",
        )),
        (None, Some(_)) => Err(fail(
            "fence.authority.username",
            "password_env and password_file need the username they belong to",
        )),
    }
}

/// The credentials as ZooKeeper's digest scheme takes them (`user:password`), when the locks' ACLs
/// ask for them.
fn zookeeper_digest(config: &AuthorityConfig) -> Result<Option<String>, MappingError> {
    match credentials(config)? {
        None => Ok(None),
        Some((user, password)) if !user.is_empty() && !user.contains(':') => {
            Ok(Some(format!("{user}:{password}")))
        }
        Some(_) => Err(MappingError {
            field: "fence.authority.username",
            message: "a ZooKeeper digest user name: not empty, no ':'".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{connect_string, is_zookeeper_path};

    #[test]
    fn a_connect_string_is_checked_and_written_without_spaces() {
        assert_eq!(
            connect_string(" zk1:2181 , zk2:2182/apps/locks "),
            Ok("zk1:2181,zk2:2182/apps/locks".to_owned())
        );
        assert_eq!(
            connect_string("[::1]:2181,10.0.0.2:2181"),
            Ok("[::1]:2181,10.0.0.2:2181".to_owned())
        );
        for refused in [
            "",
            "zk1",
            "zk1:",
            "zk1:0",
            "zk1:99999",
            ":2181",
            "a:1:2",
            "z k:2181",
            "zk1:2181,",
            "zk1:2181/",
            "zk1:2181/apps/",
            "zk1:2181/a//b",
            "zk1:2181/a/../b",
            "[]:2181",
        ] {
            assert!(connect_string(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn a_zookeeper_path_is_absolute_with_no_empty_or_dot_segment() {
        for accepted in ["/locks/invoice/{id}", "/x", "/a.b/c..d"] {
            assert!(is_zookeeper_path(accepted), "{accepted:?}");
        }
        for refused in [
            "locks/{id}",
            "/",
            "/locks/",
            "//x",
            "/a/./b",
            "/a/../b",
            "/a/.",
        ] {
            assert!(!is_zookeeper_path(refused), "{refused:?}");
        }
    }
}
