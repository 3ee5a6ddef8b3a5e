//! Reads a configuration file, rejects unknown keys, and checks its plain data so that an error
//! names the file, the route and the field before anything starts. Compiling the routes is
//! the compiled module's job.

use std::path::{Path, PathBuf};

use super::{
    Config, ConfigError, EtcdStoreConfig, StoreConfig, DEFAULT_ETCD_MAX_BATCH, MIN_MAX_HEADER_BYTES,
};

/// Reads, parses and validates the file at `path`.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_owned(),
        source,
    })?;
    parse_str(&text, path)
}

/// Parses and validates configuration text; `origin` names it in errors.
pub fn parse_str(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    let deserializer = toml::Deserializer::new(text);
    let config: Config = match serde_path_to_error::deserialize(deserializer) {
        Ok(config) => config,
        Err(e) if names_no_backend(&e) => with_embedded_backend(text, origin)?,
        Err(e) => return Err(deserialize_error(text, origin, e)),
    };
    validate(&config, origin)?;
    Ok(config)
}

/// Whether deserializing failed only because `[store]` names no `backend`.
fn names_no_backend(error: &serde_path_to_error::Error<toml::de::Error>) -> bool {
    error.path().to_string() == "store" && error.inner().message().contains("`backend`")
}

/// The keys of an embedded `[store]` table.
const EMBEDDED_KEYS: [&str; 3] = ["path", "max_batch", "cache_capacity"];

/// A `[store]` without `backend` is the embedded store (the default): the text is read again
/// with `backend = "embedded"` on a line of its own after the table's header, and the lines of
/// any error below it are counted as in the file.
fn with_embedded_backend(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    // A table naming another backend's settings (a `url`, `endpoints`) lacks its `backend`: say
    // that, rather than that the embedded store takes no `url`.
    let table: toml::Table = text.parse().unwrap_or_default();
    if let Some(toml::Value::Table(store)) = table.get("store") {
        if let Some(other) = store.keys().find(|k| !EMBEDDED_KEYS.contains(&k.as_str())) {
            return Err(ConfigError::Invalid {
                file: origin.to_owned(),
                route: None,
                field: "store.backend".to_owned(),
                message: format!(
                    "missing: [store] names `{other}`, which the embedded store (the default) does not take; write backend = \"postgres\", \"redis\" or \"etcd\""
                ),
            });
        }
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let header = lines.iter().position(|line| {
        let line = line.split('#').next().unwrap_or_default().trim();
        line.strip_prefix('[')
            .and_then(|l| l.strip_suffix(']'))
            .is_some_and(|name| name.trim() == "store")
    });
    let Some(header) = header else {
        // `store.path = ...` as a dotted key: nothing to add a line after.
        return Err(ConfigError::Invalid {
            file: origin.to_owned(),
            route: None,
            field: "store.backend".to_owned(),
            message: "write the store as a [store] table (backend defaults to \"embedded\")"
                .to_owned(),
        });
    };
    let mut amended = String::with_capacity(text.len() + 24);
    for (i, line) in lines.iter().enumerate() {
        amended.push_str(line);
        if i == header {
            if !line.ends_with('\n') {
                amended.push('\n');
            }
            amended.push_str("backend = \"embedded\"\n");
        }
    }
    serde_path_to_error::deserialize(toml::Deserializer::new(&amended)).map_err(|e| {
        // Lines after the added one are one further down in `amended` than in the file.
        deserialize_error_at(&amended, origin, e, Some(header + 2))
    })
}

fn validate(config: &Config, origin: &Path) -> Result<(), ConfigError> {
    super::check_built(config).map_err(|missing| ConfigError::Invalid {
        file: origin.to_owned(),
        route: missing.route,
        field: missing.field.to_owned(),
        message: missing.message,
    })?;
    for route in &config.routes {
        if route.fence.max_advance == Some(0) {
            return Err(ConfigError::Invalid {
                file: origin.to_owned(),
                route: Some(route.name.clone()),
                field: "fence.max_advance".to_owned(),
                message: "must be at least 1: 0 would refuse every new generation".to_owned(),
            });
        }
    }
    let store_error = |field: &str, message: &str| ConfigError::Invalid {
        file: origin.to_owned(),
        route: None,
        field: format!("store.{field}"),
        message: message.to_owned(),
    };
    validate_server(config, origin)?;
    if let Some(admin) = &config.admin {
        let admin_error = |field: &str, message: &str| ConfigError::Invalid {
            file: origin.to_owned(),
            route: None,
            field: format!("admin.{field}"),
            message: message.to_owned(),
        };
        let given = [
            admin.token.is_some(),
            admin.token_env.is_some(),
            admin.token_file.is_some(),
        ];
        match given.iter().filter(|g| **g).count() {
            0 => {
                return Err(admin_error(
                    "token",
                    "the admin API needs a bearer token: set token_env, token_file or token",
                ))
            }
            1 => {}
            _ => {
                return Err(admin_error(
                    "token",
                    "give one of token, token_env and token_file",
                ))
            }
        }
        if admin.token.as_ref().is_some_and(|token| token.len() < 16) {
            return Err(admin_error("token", "use at least 16 characters"));
        }
    }
    if let Some(telemetry) = &config.telemetry {
        check_otlp_endpoint(&telemetry.otlp_endpoint).map_err(|message| ConfigError::Invalid {
            file: origin.to_owned(),
            route: None,
            field: "telemetry.otlp_endpoint".to_owned(),
            message,
        })?;
    }
    if config.store.max_batch() == 0 {
        return Err(store_error("max_batch", "must be at least 1"));
    }
    match &config.store {
        StoreConfig::Postgres(pg) => {
            let valid = !pg.schema.is_empty()
                && pg.schema.len() <= 63
                && pg
                    .schema
                    .starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && pg
                    .schema
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !valid {
                return Err(store_error(
                    "schema",
                    "must be a lower-case identifier: letters, digits, '_', at most 63 bytes",
                ));
            }
            if pg.max_connections == 0 {
                return Err(store_error("max_connections", "must be at least 1"));
            }
        }
        StoreConfig::Redis(redis) if redis.key_prefix.is_empty() => {
            return Err(store_error(
                "key_prefix",
                "must not be empty: fencegate's keys must be told apart",
            ));
        }
        StoreConfig::Etcd(etcd) => validate_etcd(etcd).map_err(|(f, m)| store_error(f, m))?,
        _ => {}
    }
    Ok(())
}

/// `[store] backend = "etcd"`: endpoints that can be reached, a prefix, a batch etcd accepts, and
/// a password only by reference. `Err`: the field below `store.` and why.
fn validate_etcd(etcd: &EtcdStoreConfig) -> Result<(), (&'static str, &'static str)> {
    if etcd.endpoints.is_empty() {
        return Err((
            "endpoints",
            "name at least one client URL, e.g. \"http://127.0.0.1:2379\"",
        ));
    }
    let scheme_ok = |e: &String| e.starts_with("http://") || e.starts_with("https://");
    if !etcd.endpoints.iter().all(scheme_ok) {
        return Err(("endpoints", "each endpoint is an http:// or https:// URL"));
    }
    if etcd.key_prefix.is_empty() {
        return Err((
            "key_prefix",
            "must not be empty: fencegate's keys must be told apart",
        ));
    }
    if etcd.max_batch > DEFAULT_ETCD_MAX_BATCH {
        return Err((
            "max_batch",
            "at most 120: etcd refuses larger transactions under its default --max-txn-ops (128)",
        ));
    }
    if etcd.request_timeout.is_zero() {
        return Err(("request_timeout", "must be more than zero"));
    }
    if etcd.password_env.is_some() && etcd.password_file.is_some() {
        return Err((
            "password_file",
            "give password_env or password_file, not both",
        ));
    }
    match (
        &etcd.username,
        etcd.password_env.is_some() || etcd.password_file.is_some(),
    ) {
        (Some(_), false) => Err((
            "password_env",
            "a username needs the variable (or password_file) holding its password",
        )),
        (None, true) => Err((
            "username",
            "password_env and password_file need the username they belong to",
        )),
        _ => Ok(()),
    }
}

/// The `[server]` limits: each must leave the listener able to serve at all.
fn validate_server(config: &Config, origin: &Path) -> Result<(), ConfigError> {
    let server = &config.server;
    let server_error = |field: &str, message: String| ConfigError::Invalid {
        file: origin.to_owned(),
        route: None,
        field: format!("server.{field}"),
        message,
    };
    if server.max_connections == 0 {
        return Err(server_error(
            "max_connections",
            "must be at least 1".to_owned(),
        ));
    }
    if !(0.0..=1.0).contains(&server.access_log_sample) {
        return Err(server_error(
            "access_log_sample",
            format!(
                "{} is not a share: give 0.0 (only refusals and errors) to 1.0 (every request)",
                server.access_log_sample
            ),
        ));
    }
    if server.max_header_bytes < MIN_MAX_HEADER_BYTES {
        return Err(server_error(
            "max_header_bytes",
            format!("must be at least {MIN_MAX_HEADER_BYTES} bytes (8KiB)"),
        ));
    }
    if u32::try_from(server.max_header_bytes).is_err() {
        return Err(server_error(
            "max_header_bytes",
            "must be under 4GiB".to_owned(),
        ));
    }
    if server.max_headers == 0 {
        return Err(server_error("max_headers", "must be at least 1".to_owned()));
    }
    let timeouts = [
        ("first_byte_timeout", server.first_byte_timeout),
        ("idle_timeout", server.idle_timeout),
        ("head_timeout", server.head_timeout),
        ("body_timeout", server.body_timeout),
        ("write_timeout", server.write_timeout),
    ];
    for (field, timeout) in timeouts {
        if timeout.is_zero() {
            return Err(server_error(field, "must be longer than 0s".to_owned()));
        }
    }
    if server.max_concurrent_streams == 0 {
        return Err(server_error(
            "max_concurrent_streams",
            "must be at least 1".to_owned(),
        ));
    }
    if server.max_upstream_connections == 0 {
        return Err(server_error(
            "max_upstream_connections",
            "must be at least 1".to_owned(),
        ));
    }
    if config
        .admin
        .as_ref()
        .is_some_and(|a| a.max_connections == 0)
    {
        return Err(ConfigError::Invalid {
            file: origin.to_owned(),
            route: None,
            field: "admin.max_connections".to_owned(),
            message: "must be at least 1".to_owned(),
        });
    }
    for route in &config.routes {
        let route_error = |field: &str, message: String| ConfigError::Invalid {
            file: origin.to_owned(),
            route: Some(route.name.clone()),
            field: field.to_owned(),
            message,
        };
        if route.max_upstream_connections == Some(0) {
            return Err(route_error(
                "max_upstream_connections",
                "must be at least 1".to_owned(),
            ));
        }
        // A body the budget can never hold would be refused 503 every time.
        if let Some(idempotency) = &route.idempotency {
            if idempotency.max_request_body > server.max_buffered_bytes {
                return Err(route_error(
                    "idempotency.max_request_body",
                    format!(
                        "is larger than [server] max_buffered_bytes ({} bytes): such a body could never be buffered",
                        server.max_buffered_bytes
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Turns a serde error with its path (`routes[2].fence.mode`) into one that names the route.
fn deserialize_error(
    text: &str,
    origin: &Path,
    error: serde_path_to_error::Error<toml::de::Error>,
) -> ConfigError {
    deserialize_error_at(text, origin, error, None)
}

/// [`deserialize_error`] for text with one line added at `added_line` (1-based), which the
/// line numbers of the message leave out.
fn deserialize_error_at(
    text: &str,
    origin: &Path,
    error: serde_path_to_error::Error<toml::de::Error>,
    added_line: Option<usize>,
) -> ConfigError {
    let path = error.path().to_string();
    let inner = error.into_inner();
    let message = inner.message().to_owned();
    let file: PathBuf = origin.to_owned();
    let location = inner
        .span()
        .map(|span| line_of(text, span.start))
        .map(|line| match added_line {
            Some(added) if line > added => line - 1,
            _ => line,
        })
        .map(|line| format!(" (line {line})"))
        .unwrap_or_default();
    if path == "." || path.is_empty() {
        return ConfigError::Syntax {
            file,
            message: format!("{message}{location}"),
        };
    }
    let (route, field) = split_route_path(text, &path);
    let hint = hint_for(&field, &message);
    ConfigError::Invalid {
        file,
        route,
        field,
        message: format!("{message}{location}{hint}"),
    }
}

/// What `check-config` and `serve` check beyond the file: the variables it names for secrets
/// are set. The one-shot commands (`migrate`, `store adopt`, `intents`) do not need them.
pub fn check_environment(config: &Config, origin: &Path) -> Result<(), ConfigError> {
    let Some(admin) = config.admin.as_ref().filter(|admin| admin.token.is_none()) else {
        return Ok(());
    };
    let (field, source) = match (&admin.token_env, &admin.token_file) {
        (Some(name), _) => ("admin.token_env", format!("environment variable {name}")),
        (None, Some(path)) => ("admin.token_file", format!("{}", path.display())),
        (None, None) => return Ok(()),
    };
    let problem = match admin.bearer_token() {
        Ok(Some(token)) if token.len() >= 16 => return Ok(()),
        Ok(_) => format!("{source} holds fewer than 16 characters: use a longer admin token"),
        Err(reason) => {
            format!("{reason}: it must hold the admin bearer token (at least 16 characters)")
        }
    };
    Err(ConfigError::Invalid {
        file: origin.to_owned(),
        route: None,
        field: field.to_owned(),
        message: problem,
    })
}

/// What to write instead, for mistakes a message alone does not explain.
fn hint_for(field: &str, message: &str) -> &'static str {
    if field.ends_with("listen") && message.contains("socket address") {
        "; listen takes an IP address and a port, such as 127.0.0.1:8401, 0.0.0.0:8401 or [::1]:8401 (host names such as localhost are not resolved)"
    } else {
        ""
    }
}

/// `routes[2].fence.mode` → (the name of the third route, `fence.mode`); other paths are unchanged.
fn split_route_path(text: &str, path: &str) -> (Option<String>, String) {
    let Some(rest) = path.strip_prefix("routes[") else {
        return (None, path.to_owned());
    };
    let Some((index, field)) = rest.split_once(']') else {
        return (None, path.to_owned());
    };
    let field = field.trim_start_matches('.');
    let field = if field.is_empty() { "routes" } else { field };
    let name = index
        .parse::<usize>()
        .ok()
        .and_then(|i| route_name_at(text, i))
        .unwrap_or_else(|| format!("#{}", index.parse::<usize>().map_or(0, |i| i + 1)));
    (Some(name), field.to_owned())
}

fn route_name_at(text: &str, index: usize) -> Option<String> {
    let value: toml::Table = text.parse().ok()?;
    let route = value.get("routes")?.as_array()?.get(index)?;
    route.get("name")?.as_str().map(str::to_owned)
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(0, |head| head.lines().count().max(1))
}

/// A collector's OTLP/HTTP base URL: `http://host:port`, optionally with a path.
fn check_otlp_endpoint(endpoint: &str) -> Result<(), String> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("{endpoint:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") if uri.authority().is_some() => Ok(()),
        Some("https") => Err(format!(
            "{endpoint:?}: spans are exported over plain HTTP only; point it at a collector or agent on a trusted network (http://host:4318)"
        )),
        _ => Err(format!(
            "{endpoint:?}: give the collector's OTLP/HTTP address, such as http://127.0.0.1:4318"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[server]
listen = "127.0.0.1:8080"

[store]
backend = "embedded"
path = "data/fencegate.db"

[[routes]]
name = "invoices"
path = "/invoices/{id}"

upstream = "http://127.0.0.1:9000"
resource_key = "invoice:{id}"
timeout = "30s"

[routes.fence]
header = "X-Fence"
mode = "enforce"
compare = "monotonic"
"#;

    /// The whole path a file takes: its data checked here, its routes compiled.
    fn parse(text: &str) -> Result<Config, ConfigError> {
        crate::compiled::Compiled::parse(text, Path::new("test.toml")).map(|c| c.config)
    }

    #[test]
    fn the_documented_shape_loads_as_written() {
        let config = parse(GOOD).expect("documented example must load");
        assert_eq!(config.routes.len(), 1);
        assert_eq!(config.routes[0].timeout, std::time::Duration::from_secs(30));
    }

    /// `drain_delay` is 5 s unless set; zero (drain at once) is allowed, unlike the timeouts.
    #[test]
    fn the_drain_delay_defaults_to_five_seconds_and_may_be_zero() {
        use std::time::Duration;
        let config = parse(GOOD).expect("documented example must load");
        assert_eq!(config.server.drain_delay, Duration::from_secs(5));
        let at = |delay: &str| {
            GOOD.replacen(
                "[server]\n",
                &format!("[server]\ndrain_delay = \"{delay}\"\n"),
                1,
            )
        };
        let zero = parse(&at("0s")).expect("zero drain delay");
        assert_eq!(zero.server.drain_delay, Duration::ZERO);
        assert_eq!(
            parse(&at("250ms"))
                .expect("a drain delay")
                .server
                .drain_delay,
            Duration::from_millis(250)
        );
        let message = parse(&at("soon")).unwrap_err().to_string();
        assert!(message.contains("drain_delay"), "{message}");
        let message = parse(&GOOD.replacen("[server]\n", "[server]\nshutdown_grace = \"0s\"\n", 1))
            .unwrap_err()
            .to_string();
        assert!(message.contains("zero"), "{message}");
    }

    #[test]
    fn unknown_route_key_names_file_route_and_field() {
        let text = GOOD.replace(
            "compare = \"monotonic\"",
            "compare = \"monotonic\"\nmood = 1",
        );
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("test.toml"), "{message}");
        assert!(message.contains("route \"invoices\""), "{message}");
        assert!(message.contains("mood"), "{message}");
    }

    #[test]
    fn bad_enum_value_names_the_field() {
        let text = GOOD.replace("mode = \"enforce\"", "mode = \"enforced\"");
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("route \"invoices\""), "{message}");
        assert!(message.contains("fence.mode"), "{message}");
    }

    #[test]
    fn template_over_unknown_segment_is_rejected() {
        let text = GOOD.replace("invoice:{id}", "invoice:{invoice_id}");
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("resource_key"), "{message}");
        assert!(message.contains("invoice_id"), "{message}");
    }

    #[test]
    fn unknown_top_level_key_is_rejected() {
        let text = format!("{GOOD}\n[extra]\nx = 1\n");
        assert!(parse(&text).is_err());
    }

    #[test]
    fn unknown_store_key_is_rejected() {
        let text = GOOD.replace(
            "backend = \"embedded\"",
            "backend = \"embedded\"\npth = \"x\"",
        );
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("pth"), "{message}");
    }

    #[test]
    fn server_limits_that_could_not_serve_are_rejected() {
        for (line, field) in [
            ("max_connections = 0", "server.max_connections"),
            ("max_header_bytes = \"4KiB\"", "server.max_header_bytes"),
            ("max_headers = 0", "server.max_headers"),
        ] {
            let text = GOOD.replace("[server]\n", &format!("[server]\n{line}\n"));
            let message = parse(&text).unwrap_err().to_string();
            assert!(message.contains("test.toml"), "{message}");
            assert!(message.contains(field), "{message}");
        }
        let text = GOOD.replace(
            "timeout = \"30s\"",
            "timeout = \"30s\"\nmax_body = \"lots\"",
        );
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("max_body"), "{message}");
        let text = GOOD.replace(
            "timeout = \"30s\"",
            "timeout = \"30s\"\nmax_body = \"2MiB\"",
        );
        assert_eq!(parse(&text).expect("valid").routes[0].max_body, 2 << 20);
    }

    #[test]
    fn bad_duration_is_rejected() {
        let text = GOOD.replace("timeout = \"30s\"", "timeout = \"soon\"");
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("timeout"), "{message}");
    }
}
