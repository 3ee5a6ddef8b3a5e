//! `[admin]`: the admin listener's settings and their defaults.

use std::net::SocketAddr;

use serde::Deserialize;

/// Admin connections served at once.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;

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
    /// A file holding the token (a mounted secret), read at start.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// Require the token on `/metrics`, `/healthz` and `/readyz` too.
    #[serde(default)]
    pub probes_require_token: bool,
    /// Admin connections served at once; more are answered 503 and closed. The `[server]`
    /// connection timeouts apply here too.
    #[serde(default = "default_admin_max_connections")]
    pub max_connections: usize,
    /// Serve the admin API over TLS (HTTP/1.1 only).
    #[serde(default)]
    pub tls: Option<super::ListenerTlsConfig>,
}

impl AdminConfig {
    /// The bearer token: the configuration's, or read now from the variable or file it names.
    /// `Err` says which cannot be read; `Ok(None)`: no token configured.
    pub fn bearer_token(&self) -> Result<Option<String>, String> {
        match &self.token {
            Some(token) => Ok(Some(token.clone())),
            None => super::secret::read(
                "token",
                self.token_env.as_deref(),
                self.token_file.as_deref(),
            )
            .map_err(|e| e.to_string()),
        }
    }
}

fn default_admin_max_connections() -> usize {
    DEFAULT_ADMIN_MAX_CONNECTIONS
}
