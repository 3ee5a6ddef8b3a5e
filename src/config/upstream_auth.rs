//! `[routes.upstream_auth]`: credentials the gateway obtains for an upstream by itself (an OAuth2
//! client-credentials grant), with where each secret is read from; their defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration;

/// A token is renewed when less than this is left of its lifetime (or less than half of it, for
/// a token that lives shorter than twice this).
pub const DEFAULT_TOKEN_REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// How long the token endpoint may take to answer.
pub const DEFAULT_TOKEN_TIMEOUT: Duration = Duration::from_secs(10);

/// `[routes.upstream_auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamAuthConfig {
    pub kind: UpstreamAuthKind,
    /// The token endpoint (`https://`, or `http://` to a loopback address only).
    pub token_url: String,
    /// The client id: given here, or read from an environment variable or a file.
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub client_id_env: Option<String>,
    #[serde(default)]
    pub client_id_file: Option<PathBuf>,
    /// The client secret: from an environment variable or a file, never written here.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    #[serde(default)]
    pub client_secret_file: Option<PathBuf>,
    /// The `scope` asked for, if the provider wants one.
    #[serde(default)]
    pub scope: Option<String>,
    /// How the client authenticates at the token endpoint.
    #[serde(default)]
    pub client_auth: ClientAuthMethod,
    #[serde(default = "default_refresh_before", with = "duration")]
    pub refresh_before: Duration,
    #[serde(default = "default_token_timeout", with = "duration")]
    pub timeout: Duration,
}

/// The kinds of upstream credentials the gateway can obtain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamAuthKind {
    /// RFC 6749 §4.4: a bearer token for the client's own id and secret (PayPal's REST API).
    Oauth2ClientCredentials,
}

/// Where the client id and secret go in the token request (RFC 6749 §2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuthMethod {
    /// HTTP Basic authentication (what every server must accept).
    #[default]
    Basic,
    /// `client_id` and `client_secret` in the form body.
    Body,
}

fn default_refresh_before() -> Duration {
    DEFAULT_TOKEN_REFRESH_BEFORE
}

fn default_token_timeout() -> Duration {
    DEFAULT_TOKEN_TIMEOUT
}
