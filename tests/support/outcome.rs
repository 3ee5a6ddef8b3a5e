//! One request from a client that never panics and never waits forever: what came back — a whole
//! answer, a head whose body broke off, no answer at all, or nothing within a bound — so a test
//! can count every outcome (I7).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A client that has heard nothing for this long counts as hung. Far above any route or gate
/// timeout in the tests: it detects hangs, it does not measure speed.
pub const HANG_BOUND: Duration = Duration::from_secs(30);

/// A whole HTTP answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub content_type: Option<String>,
    /// The problem type's last segment, when the body is `application/problem+json` with a `type`.
    pub problem: Option<String>,
    /// `X-Fence-Current`.
    pub current: Option<u64>,
    pub body: Bytes,
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Answered(Answer),
    /// The head arrived, the body did not finish.
    BrokenBody {
        status: u16,
    },
    /// The connection failed before a head arrived.
    NoAnswer(String),
    /// Nothing within [`HANG_BOUND`].
    Hung,
}

impl Outcome {
    /// The status of a whole answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Answered(answer) => Some(answer.status),
            _ => None,
        }
    }

    /// A short label for counting outcomes: `200`, `409/stale-fence`, `broken-200`, `no-answer`.
    pub fn label(&self) -> String {
        match self {
            Outcome::Answered(Answer {
                status,
                problem: Some(problem),
                ..
            }) => format!("{status}/{problem}"),
            Outcome::Answered(answer) => answer.status.to_string(),
            Outcome::BrokenBody { status } => format!("broken-{status}"),
            Outcome::NoAnswer(_) => "no-answer".to_owned(),
            Outcome::Hung => "hung".to_owned(),
        }
    }
}

/// Sends one HTTP/1.1 request with an empty body on a fresh connection.
pub async fn exchange(method: &str, url: &str, headers: &[(&str, String)]) -> Outcome {
    tokio::time::timeout(HANG_BOUND, attempt(method, url, headers))
        .await
        .unwrap_or(Outcome::Hung)
}

async fn attempt(method: &str, url: &str, headers: &[(&str, String)]) -> Outcome {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut builder = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    let request = builder.body(Full::new(Bytes::new())).expect("request");
    let response = match client.request(request).await {
        Ok(response) => response,
        Err(e) => return Outcome::NoAnswer(format!("{e:?}")),
    };
    let (parts, body) = response.into_parts();
    let status = parts.status.as_u16();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Outcome::BrokenBody { status };
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type");
    let problem = (content_type.as_deref() == Some("application/problem+json"))
        .then(|| serde_json::from_slice::<serde_json::Value>(&body).ok())
        .flatten()
        .and_then(|json| json["type"].as_str().map(str::to_owned))
        .map(|kind| kind.rsplit('/').next().unwrap_or_default().to_owned());
    Outcome::Answered(Answer {
        status,
        content_type,
        problem,
        current: header("x-fence-current").and_then(|v| v.parse().ok()),
        body,
    })
}
