//! A fake payment provider: it charges once per call, and — like real providers — may honour the
//! idempotency header (a repeated key gets the first answer and no new charge). Faults can be
//! queued: charge then drop the connection, charge then answer 500, charge then answer too late.
//! It can also require OAuth2 bearer tokens it issues itself at `POST /oauth2/token` (client
//! credentials, HTTP Basic), as PayPal does: tokens that expire, and that it can revoke.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What the provider does after charging, for the next call that charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Charge, then close the connection without answering.
    DropConnection,
    /// Charge, then answer 500.
    Answer500,
    /// Charge, then answer after this long.
    AnswerLate(Duration),
}

/// One charge the provider made.
#[derive(Debug, Clone)]
pub struct Charge {
    pub path: String,
    pub key: Option<String>,
    pub body: Bytes,
}

#[derive(Default)]
struct State {
    charges: Vec<Charge>,
    answers: HashMap<String, (u16, String)>,
    faults: VecDeque<Fault>,
    /// Answers (status, body) the next calls get before anything is charged.
    refusals: VecDeque<(u16, String)>,
    /// Whether an answer from a known key carries `Idempotent-Replayed: true`, as Stripe's do.
    marks_replays: bool,
    calls: usize,
    /// When set, calls need a bearer token from `/oauth2/token`.
    oauth: Option<OAuth>,
}

/// The token endpoint's client and what it has issued.
struct OAuth {
    client_id: String,
    client_secret: String,
    lifetime: Duration,
    /// Every token issued, with when it expires.
    issued: Vec<(String, std::time::Instant)>,
    /// Tokens before this index are revoked.
    revoked_before: usize,
    /// Every `Authorization` a call (not a grant) arrived with.
    presented: Vec<String>,
}

pub struct Provider {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

/// The header the fake provider reads keys from.
pub const KEY_HEADER: &str = "idempotency-key";

impl Provider {
    pub async fn start(honours_keys: bool) -> Provider {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind provider");
        let addr = listener.local_addr().expect("provider address");
        let state: Arc<Mutex<State>> = Arc::default();
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let shared = Arc::clone(&shared);
                        async move { handle(request, honours_keys, shared).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Provider { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues a fault for the next call that charges.
    pub fn fail_next(&self, fault: Fault) {
        self.state
            .lock()
            .expect("provider lock")
            .faults
            .push_back(fault);
    }

    /// The next call is answered `status` (with `Retry-After: 2`) and charges nothing: a rate
    /// limit, a conflicting request in flight, a declined card.
    pub fn refuse_next(&self, status: u16) {
        self.answer_next(status, &format!("{{\"refused\":{status}}}"));
    }

    /// The next call is answered `status` with `body` (and `Retry-After: 2`) and charges nothing:
    /// an error a GraphQL provider reports inside a 200.
    pub fn answer_next(&self, status: u16, body: &str) {
        self.state
            .lock()
            .expect("provider lock")
            .refusals
            .push_back((status, body.to_owned()));
    }

    /// From now on an answer from a known key carries `Idempotent-Replayed: true`, as Stripe's
    /// replays do.
    pub fn mark_replays(&self) {
        self.state.lock().expect("provider lock").marks_replays = true;
    }

    /// From now on calls need a bearer token this provider issued to `client_id` with
    /// `client_secret` and that has not expired (`lifetime`) or been revoked; others get 401.
    pub fn require_tokens(&self, client_id: &str, client_secret: &str, lifetime: Duration) {
        self.state.lock().expect("provider lock").oauth = Some(OAuth {
            client_id: client_id.to_owned(),
            client_secret: client_secret.to_owned(),
            lifetime,
            issued: Vec::new(),
            revoked_before: 0,
            presented: Vec::new(),
        });
    }

    /// Revokes every token issued so far.
    pub fn revoke_tokens(&self) {
        if let Some(oauth) = &mut self.state.lock().expect("provider lock").oauth {
            oauth.revoked_before = oauth.issued.len();
        }
    }

    /// Tokens issued so far.
    pub fn grants(&self) -> usize {
        self.state
            .lock()
            .expect("provider lock")
            .oauth
            .as_ref()
            .map_or(0, |oauth| oauth.issued.len())
    }

    /// The `Authorization` of every call so far, in order.
    pub fn presented(&self) -> Vec<String> {
        self.state
            .lock()
            .expect("provider lock")
            .oauth
            .as_ref()
            .map_or_else(Vec::new, |oauth| oauth.presented.clone())
    }

    pub fn charges(&self) -> Vec<Charge> {
        self.state.lock().expect("provider lock").charges.clone()
    }

    /// Calls received (charging or answered from the key).
    pub fn calls(&self) -> usize {
        self.state.lock().expect("provider lock").calls
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped after charging")
    }
}

impl std::error::Error for Dropped {}

async fn handle(
    request: Request<Incoming>,
    honours_keys: bool,
    state: Arc<Mutex<State>>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let path = request.uri().path().to_owned();
    if let Some(answer) = check_token(&request, &path, &state) {
        return Ok(answer);
    }
    let key = request
        .headers()
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (answer, fault) = {
        let mut state = state.lock().expect("provider lock");
        state.calls += 1;
        if let Some((status, text)) = state.refusals.pop_front() {
            return Ok(Response::builder()
                .status(StatusCode::from_u16(status).unwrap_or(StatusCode::OK))
                .header("content-type", "application/json")
                .header("retry-after", "2")
                .body(Full::new(Bytes::from(text)))
                .expect("static response"));
        }
        let known = key
            .as_ref()
            .filter(|_| honours_keys)
            .and_then(|k| state.answers.get(k).cloned());
        match known {
            Some((status, text)) if state.marks_replays => {
                return Ok(Response::builder()
                    .status(StatusCode::from_u16(status).unwrap_or(StatusCode::OK))
                    .header("content-type", "application/json")
                    .header("idempotent-replayed", "true")
                    .body(Full::new(Bytes::from(text)))
                    .expect("static response"));
            }
            Some(answer) => (answer, None),
            None => {
                state.charges.push(Charge {
                    path,
                    key: key.clone(),
                    body,
                });
                let answer = (
                    201,
                    format!("{{\"charge\":\"ch_{}\"}}", state.charges.len()),
                );
                if let Some(key) = key {
                    state.answers.insert(key, answer.clone());
                }
                (answer, state.faults.pop_front())
            }
        }
    };
    let (status, text) = match fault {
        Some(Fault::DropConnection) => return Err(Dropped),
        Some(Fault::Answer500) => (500, "{\"error\":\"internal\"}".to_owned()),
        Some(Fault::AnswerLate(delay)) => {
            tokio::time::sleep(delay).await;
            answer
        }
        None => answer,
    };
    Ok(Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::OK))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)))
        .expect("static response"))
}

/// With tokens required: the token endpoint's answer, or a 401 for a call without a valid
/// token; `None` lets the call through.
fn check_token(
    request: &Request<Incoming>,
    path: &str,
    state: &Mutex<State>,
) -> Option<Response<Full<Bytes>>> {
    use base64::Engine as _;
    let mut state = state.lock().expect("provider lock");
    let oauth = state.oauth.as_mut()?;
    let authorization = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let answer = |status: u16, body: String| {
        Some(
            Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .expect("static response"),
        )
    };
    if path == "/oauth2/token" {
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", oauth.client_id, oauth.client_secret))
        );
        if authorization != expected {
            return answer(401, r#"{"error":"invalid_client"}"#.to_owned());
        }
        let token = format!("tok-{}", oauth.issued.len() + 1);
        oauth
            .issued
            .push((token.clone(), std::time::Instant::now() + oauth.lifetime));
        return answer(
            200,
            format!(
                r#"{{"access_token":"{token}","token_type":"Bearer","expires_in":{}}}"#,
                oauth.lifetime.as_secs()
            ),
        );
    }
    oauth.presented.push(authorization.clone());
    let now = std::time::Instant::now();
    let valid = oauth
        .issued
        .iter()
        .enumerate()
        .any(|(index, (token, expires))| {
            index >= oauth.revoked_before
                && *expires > now
                && authorization == format!("Bearer {token}")
        });
    if valid {
        return None;
    }
    state.calls += 1;
    answer(401, r#"{"error":"invalid_token"}"#.to_owned())
}
