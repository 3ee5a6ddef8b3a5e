//! One OAuth2 client-credentials grant (RFC 6749 §4.4): the token request, with the client's id
//! and secret in HTTP Basic authentication or the form, and the token endpoint's answer read into
//! a bearer token and its lifetime. Nothing here ever puts the secret in an error.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde::Deserialize;

use crate::config::ClientAuthMethod;

/// Largest token endpoint answer read; a token answer is a few hundred bytes.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The longest lifetime a token is taken to have, whatever `expires_in` says.
const MAX_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// Longest piece of the endpoint's `error` field quoted in an error.
const MAX_QUOTED: usize = 100;

pub(super) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Why no token was obtained.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrantError {
    #[error("the token endpoint could not be reached: {0}")]
    Transport(String),
    #[error("the token endpoint did not answer within {}ms", .0.as_millis())]
    Timeout(Duration),
    #[error("the token endpoint refused the grant: {status}{}", code.as_ref().map_or_else(String::new, |c| format!(" ({c})")))]
    Refused {
        status: StatusCode,
        /// The OAuth2 `error` code of the answer, if it had one (`invalid_client`).
        code: Option<String>,
    },
    #[error("the token endpoint's answer is not a token: {0}")]
    Malformed(String),
    #[error("the upstream refused the token just obtained (401)")]
    RefusedByUpstream,
}

/// What the grant asks with: the client and what it authenticates with.
pub(super) struct Grant {
    pub token_url: Uri,
    pub client_id: String,
    pub client_secret: String,
    pub scope: Option<String>,
    pub client_auth: ClientAuthMethod,
}

/// A token as the endpoint issued it.
pub(super) struct Issued {
    /// `Bearer <access_token>`, marked sensitive.
    pub authorization: HeaderValue,
    /// `expires_in`, when the endpoint said.
    pub lifetime: Option<Duration>,
}

/// The token endpoint's success answer (RFC 6749 §5.1).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    token_type: String,
    #[serde(default)]
    expires_in: Option<Seconds>,
}

/// `expires_in`: a number, or (from some servers) a string of digits.
#[derive(Deserialize)]
#[serde(untagged)]
enum Seconds {
    Number(f64),
    Text(String),
}

impl Grant {
    /// Asks the endpoint for a token, within `timeout`.
    pub(super) async fn request(
        &self,
        http: &HttpClient,
        timeout: Duration,
    ) -> Result<Issued, GrantError> {
        let exchange = async {
            let answer = http
                .request(self.token_request()?)
                .await
                .map_err(|e| GrantError::Transport(error_chain(&e)))?;
            let status = answer.status();
            let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| GrantError::Transport(e.to_string()))?
                .to_bytes();
            Ok::<_, GrantError>((status, body))
        };
        let (status, body) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| GrantError::Timeout(timeout))??;
        read_answer(status, &body)
    }

    fn token_request(&self) -> Result<Request<Full<Bytes>>, GrantError> {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        if let Some(scope) = &self.scope {
            form.append_pair("scope", scope);
        }
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(self.token_url.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ACCEPT, "application/json");
        match self.client_auth {
            ClientAuthMethod::Basic => {
                // RFC 6749 §2.3.1: each form-encoded, then joined by ':'.
                let pair = format!(
                    "{}:{}",
                    form_encoded(&self.client_id),
                    form_encoded(&self.client_secret)
                );
                let mut value = HeaderValue::from_str(&format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                ))
                .map_err(|_| GrantError::Malformed("the client credentials".to_owned()))?;
                value.set_sensitive(true);
                builder = builder.header(AUTHORIZATION, value);
            }
            ClientAuthMethod::Body => {
                form.append_pair("client_id", &self.client_id);
                form.append_pair("client_secret", &self.client_secret);
            }
        }
        builder
            .body(Full::new(Bytes::from(form.finish())))
            .map_err(|_| GrantError::Malformed("the token request could not be built".to_owned()))
    }
}

fn form_encoded(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The token in a 200 answer; anything else is the endpoint's refusal.
fn read_answer(status: StatusCode, body: &[u8]) -> Result<Issued, GrantError> {
    if status != StatusCode::OK {
        let code = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(quoted));
        return Err(GrantError::Refused { status, code });
    }
    let answer: TokenAnswer = serde_json::from_slice(body).map_err(|e| {
        // serde_json's message names a field or a position, never the token's text.
        GrantError::Malformed(e.to_string())
    })?;
    if !answer.token_type.eq_ignore_ascii_case("bearer") {
        return Err(GrantError::Malformed(format!(
            "token_type {} is not Bearer",
            quoted(&answer.token_type)
        )));
    }
    if answer.access_token.is_empty() {
        return Err(GrantError::Malformed("access_token is empty".to_owned()));
    }
    let mut authorization = HeaderValue::from_str(&format!("Bearer {}", answer.access_token))
        .map_err(|_| {
            GrantError::Malformed("access_token holds characters a header cannot".to_owned())
        })?;
    authorization.set_sensitive(true);
    let seconds = match answer.expires_in {
        None => None,
        Some(Seconds::Number(n)) if n.is_finite() && n >= 0.0 => Some(n),
        Some(Seconds::Text(text)) if text.trim().parse::<u64>().is_ok() => {
            text.trim().parse::<f64>().ok()
        }
        Some(_) => {
            return Err(GrantError::Malformed(
                "expires_in is not a number of seconds".to_owned(),
            ))
        }
    };
    // Under a second says nothing usable (renewing on every request would follow): the token is
    // then used until it is refused. Longer than a year is taken as a year.
    let lifetime = seconds
        .filter(|&s| s >= 1.0)
        .map(|s| Duration::from_secs_f64(s.min(MAX_LIFETIME.as_secs_f64())));
    Ok(Issued {
        authorization,
        lifetime,
    })
}

/// `text`, cut short and with anything but printable ASCII escaped, to quote in an error.
fn quoted(text: &str) -> String {
    let cut: String = text.chars().take(MAX_QUOTED).collect();
    format!("{:?}", cut.escape_default().to_string())
}

/// An error and its causes on one line (hyper's own message is only "client error (Connect)").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_token_with_its_lifetime_is_read() {
        let issued = read_answer(
            StatusCode::OK,
            br#"{"scope":"x","access_token":"A21AA.t0k","token_type":"Bearer","app_id":"APP","expires_in":32400}"#,
        )
        .unwrap();
        assert_eq!(issued.authorization, "Bearer A21AA.t0k");
        assert!(issued.authorization.is_sensitive());
        assert_eq!(issued.lifetime, Some(Duration::from_secs(32400)));
        let text = read_answer(
            StatusCode::OK,
            br#"{"access_token":"t","token_type":"bearer","expires_in":"60"}"#,
        )
        .unwrap();
        assert_eq!(text.lifetime, Some(Duration::from_secs(60)));
        let unknown = read_answer(
            StatusCode::OK,
            br#"{"access_token":"t","token_type":"Bearer"}"#,
        )
        .unwrap();
        assert_eq!(unknown.lifetime, None);
    }

    #[test]
    fn anything_but_a_bearer_token_is_an_error_that_never_quotes_the_token() {
        for (status, body) in [
            (
                StatusCode::OK,
                &br#"{"access_token":"sekrit","token_type":"mac"}"#[..],
            ),
            (
                StatusCode::OK,
                br#"{"access_token":"","token_type":"Bearer"}"#,
            ),
            (
                StatusCode::OK,
                br#"{"access_token":"sek rit\n","token_type":"Bearer"}"#,
            ),
            (
                StatusCode::OK,
                br#"{"access_token":"sekrit","token_type":"Bearer","expires_in":"soon"}"#,
            ),
            (StatusCode::OK, br#"{"token_type":"Bearer"}"#),
            (StatusCode::OK, b"sekrit"),
            (
                StatusCode::UNAUTHORIZED,
                br#"{"error":"invalid_client","error_description":"sekrit"}"#,
            ),
        ] {
            let error = read_answer(status, body).err().expect("an error");
            assert!(!error.to_string().contains("sekrit"), "{error}");
        }
        let refused = read_answer(StatusCode::UNAUTHORIZED, br#"{"error":"invalid_client"}"#)
            .err()
            .unwrap();
        assert_eq!(
            refused.to_string(),
            "the token endpoint refused the grant: 401 Unauthorized (\"invalid_client\")"
        );
    }

    #[test]
    fn basic_authentication_form_encodes_id_and_secret() {
        let grant = Grant {
            token_url: Uri::from_static("https://example.test/v1/oauth2/token"),
            client_id: "id:1".to_owned(),
            client_secret: "s&2 x".to_owned(),
            scope: Some("a b".to_owned()),
            client_auth: ClientAuthMethod::Basic,
        };
        let request = grant.token_request().unwrap();
        let expected = base64::engine::general_purpose::STANDARD.encode("id%3A1:s%262+x");
        assert_eq!(
            request.headers()[AUTHORIZATION],
            format!("Basic {expected}").as_str()
        );
        assert!(request.headers()[AUTHORIZATION].is_sensitive());
    }
}
