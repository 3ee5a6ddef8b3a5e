//! Credentials the gateway obtains for a route's upstream by itself: an OAuth2 bearer token from
//! the provider's client-credentials endpoint, cached, renewed before it expires and once more
//! when the upstream refuses it. Compiled with the route, so a reload reads the secret again.

mod grant;

pub use grant::GrantError;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::{HeaderValue, Uri};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use grant::{Grant, HttpClient};

use crate::config::{UpstreamAuthConfig, UpstreamAuthKind, UpstreamTlsConfig};
use crate::tls::UpstreamTls;

/// How long connecting to the token endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle connection to the token endpoint is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// After a failed grant, requests fail at once with its error for this long instead of each
/// asking the endpoint again.
const FAILURE_BACKOFF: Duration = Duration::from_secs(1);

/// Why `[routes.upstream_auth]` cannot be used; `field` is below it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct UpstreamAuthError {
    pub field: &'static str,
    pub message: String,
}

fn invalid(field: &'static str, message: impl Into<String>) -> UpstreamAuthError {
    UpstreamAuthError {
        field,
        message: message.into(),
    }
}

/// A bearer token in use: what to send, and until when it is used without renewing it.
#[derive(Debug)]
pub struct Token {
    authorization: HeaderValue,
    /// When to ask for a new one; `None`: until the upstream refuses it.
    renew_at: Option<Instant>,
    /// When it stops being valid; `None`: unknown.
    expires_at: Option<Instant>,
    /// Which grant issued it (1, 2, ...), to tell a refused token from a renewed one.
    serial: u64,
}

impl Token {
    /// The `Authorization` value, marked sensitive.
    pub fn authorization(&self) -> &HeaderValue {
        &self.authorization
    }

    fn due(&self, now: Instant) -> bool {
        self.renew_at.is_some_and(|at| now >= at)
    }

    fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }
}

/// What the cache holds between requests.
#[derive(Default)]
struct Cached {
    token: Option<Arc<Token>>,
    issued: u64,
    /// The last failed grant, while requests back off from the endpoint.
    failure: Option<(Instant, GrantError)>,
}

/// One route's upstream credentials.
pub struct UpstreamAuth {
    grant: Grant,
    http: HttpClient,
    refresh_before: Duration,
    timeout: Duration,
    cached: Mutex<Cached>,
    /// Held while a grant is asked for: concurrent requests wait for its token.
    renewing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for UpstreamAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamAuth")
            .field("token_url", &self.grant.token_url)
            .field("client_id", &self.grant.client_id)
            .finish_non_exhaustive()
    }
}

impl UpstreamAuth {
    /// Compiles the table: reads the client id and secret (environment or file), checks the
    /// token URL, and trusts for it what the route trusts for its upstream (`tls`), else the web
    /// roots.
    pub fn compile(
        config: &UpstreamAuthConfig,
        tls: Option<&UpstreamTls>,
    ) -> Result<UpstreamAuth, UpstreamAuthError> {
        match config.kind {
            UpstreamAuthKind::Oauth2ClientCredentials => {}
        }
        let token_url = token_url(&config.token_url)?;
        let client_id = match (
            &config.client_id,
            crate::config::secret::read(
                "client_id",
                config.client_id_env.as_deref(),
                config.client_id_file.as_deref(),
            ),
        ) {
            (Some(_), Ok(Some(_)) | Err(crate::config::secret::SecretError::Both { .. })) => {
                return Err(invalid(
                    "client_id",
                    "give one of client_id, client_id_env and client_id_file",
                ))
            }
            (Some(id), Ok(None)) => id.clone(),
            (None, Ok(Some(id))) => id,
            (None, Ok(None)) => {
                return Err(invalid(
                    "client_id",
                    "required: client_id, client_id_env or client_id_file",
                ))
            }
            (_, Err(e)) => return Err(invalid("client_id", e.to_string())),
        };
        let client_secret = crate::config::secret::read(
            "client_secret",
            config.client_secret_env.as_deref(),
            config.client_secret_file.as_deref(),
        )
        .map_err(|e| invalid("client_secret", e.to_string()))?
        .ok_or_else(|| {
            invalid(
                "client_secret",
                "required: client_secret_env or client_secret_file (never the secret itself)",
            )
        })?;
        if config.timeout.is_zero() {
            return Err(invalid("timeout", "must be more than 0s"));
        }
        Ok(UpstreamAuth {
            grant: Grant {
                token_url,
                client_id,
                client_secret,
                scope: config.scope.clone(),
                client_auth: config.client_auth,
            },
            http: http_client(tls)?,
            refresh_before: config.refresh_before,
            timeout: config.timeout,
            cached: Mutex::new(Cached::default()),
            renewing: tokio::sync::Mutex::new(()),
        })
    }

    /// A token to send: the cached one while it is not due for renewal. One that is due but has
    /// not expired is still sent while a renewal runs in the background; only a request without
    /// a usable token waits for a grant.
    pub async fn bearer(self: &Arc<Self>) -> Result<Arc<Token>, GrantError> {
        if let Some(token) = self.usable(|token, now| !token.due(now)) {
            return Ok(token);
        }
        if let Some(token) = self.usable(|token, now| !token.expired(now)) {
            if self.renewing.try_lock().is_ok() {
                let this = Arc::clone(self);
                tokio::spawn(async move { this.renew_in_turn(None).await });
            }
            return Ok(token);
        }
        self.renewal(None).await
    }

    /// A token after the upstream answered 401 to `refused`: a new one, unless another request
    /// has renewed it meanwhile.
    pub async fn renew_after_refusal(
        self: &Arc<Self>,
        refused: &Token,
    ) -> Result<Arc<Token>, GrantError> {
        self.renewal(Some(refused.serial)).await
    }

    /// The upstream refused a token just obtained: it is dropped, and requests fail at once for
    /// a moment instead of each asking the endpoint for another that would be refused too.
    pub fn refused_again(&self) {
        let mut cached = self.lock();
        cached.token = None;
        cached.failure = Some((Instant::now(), GrantError::RefusedByUpstream));
    }

    /// Waits for a renewal made on a task of its own, so that a request that gives up waiting
    /// (its deadline, its client gone) does not cut the grant short for the others.
    async fn renewal(self: &Arc<Self>, refused: Option<u64>) -> Result<Arc<Token>, GrantError> {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.renew_in_turn(refused).await })
            .await
            .unwrap_or_else(|e| {
                Err(GrantError::Transport(format!(
                    "the renewal task failed: {e}"
                )))
            })
    }

    /// Renews in turn with other renewals, unless the one before already did: for a refusal, a
    /// token other than the refused one; else one that is not due.
    async fn renew_in_turn(&self, refused: Option<u64>) -> Result<Arc<Token>, GrantError> {
        let _turn = self.renewing.lock().await;
        let current = match refused {
            Some(serial) => self.usable(|token, _| token.serial != serial),
            None => self.usable(|token, now| !token.due(now)),
        };
        if let Some(token) = current {
            return Ok(token);
        }
        if refused.is_some() {
            self.lock().token = None;
        }
        self.renew().await
    }

    /// The cached token, if `keep` says it may be used now.
    fn usable(&self, keep: impl Fn(&Token, Instant) -> bool) -> Option<Arc<Token>> {
        let now = Instant::now();
        self.lock()
            .token
            .as_ref()
            .filter(|token| keep(token, now))
            .cloned()
    }

    /// Asks the endpoint for a token (callers hold `renewing`), unless a grant failed a moment
    /// ago.
    async fn renew(&self) -> Result<Arc<Token>, GrantError> {
        if let Some((at, error)) = &self.lock().failure {
            if at.elapsed() < FAILURE_BACKOFF {
                return Err(error.clone());
            }
        }
        let asked = Instant::now();
        match self.grant.request(&self.http, self.timeout).await {
            Ok(issued) => {
                let mut cached = self.lock();
                cached.issued += 1;
                let expires_at = issued.lifetime.and_then(|life| asked.checked_add(life));
                let token = Arc::new(Token {
                    authorization: issued.authorization,
                    renew_at: issued.lifetime.and_then(|life| {
                        asked.checked_add(life - self.refresh_before.min(life / 2))
                    }),
                    expires_at,
                    serial: cached.issued,
                });
                tracing::info!(token_url = %self.grant.token_url, client_id = %self.grant.client_id, expires_in_secs = issued.lifetime.map(|l| l.as_secs()), "obtained an upstream token");
                cached.token = Some(Arc::clone(&token));
                cached.failure = None;
                Ok(token)
            }
            Err(error) => {
                tracing::warn!(token_url = %self.grant.token_url, client_id = %self.grant.client_id, %error, "obtaining an upstream token failed");
                self.lock().failure = Some((Instant::now(), error.clone()));
                Err(error)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.cached.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The token URL: `https://`, or `http://` to a loopback address (a local credentials sidecar);
/// the secret never crosses a network in the clear.
fn token_url(text: &str) -> Result<Uri, UpstreamAuthError> {
    let uri: Uri = text
        .parse()
        .map_err(|_| invalid("token_url", format!("{text:?} is not a URL")))?;
    let host = uri
        .host()
        .ok_or_else(|| invalid("token_url", "needs a scheme and a host"))?;
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if is_loopback(host) => Ok(uri),
        Some("http") => Err(invalid(
            "token_url",
            "http:// only to a loopback address: the client secret would cross the network in the clear",
        )),
        _ => Err(invalid("token_url", "must be an https:// URL")),
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A client for the token endpoint over HTTP/1.1, trusting what `tls` trusts (its CA file and
/// client certificate; the name verified is the token URL's host).
fn http_client(tls: Option<&UpstreamTls>) -> Result<HttpClient, UpstreamAuthError> {
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    tcp.enforce_http(false);
    let mut tls_config = match tls {
        Some(tls) => rustls::ClientConfig::clone(&tls.config),
        None => UpstreamTls::compile(&UpstreamTlsConfig::default())
            .map(|t| rustls::ClientConfig::clone(&t.config))
            .map_err(|e| invalid("token_url", e.to_string()))?,
    };
    tls_config.alpn_protocols.clear();
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls_config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    Ok(Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .build(connector))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_url_is_https_or_loopback_http() {
        for ok in [
            "https://api-m.paypal.com/v1/oauth2/token",
            "http://127.0.0.1:8080/token",
            "http://localhost/token",
            "http://[::1]:9/token",
        ] {
            assert!(token_url(ok).is_ok(), "{ok}");
        }
        for refused in [
            "http://api-m.paypal.com/v1/oauth2/token",
            "http://10.0.0.1/token",
            "ftp://127.0.0.1/token",
            "/v1/oauth2/token",
        ] {
            assert_eq!(
                token_url(refused).unwrap_err().field,
                "token_url",
                "{refused}"
            );
        }
    }
}
