//! A minimal HTTP client for tests: one request, the whole answer read into memory.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The problem type's slug (`.../stale-fence` → `stale-fence`), checking the content type.
    pub fn problem_slug(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let body = self.json();
        let kind = body["type"].as_str().expect("problem has a type");
        kind.rsplit('/').next().unwrap_or_default().to_owned()
    }
}

/// Sends one HTTP/1.1 request. `headers` may repeat a name to send two fields.
pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    request(false, method, url, headers, body).await
}

/// Sends one HTTP/2 request with prior knowledge (h2c).
pub async fn send_h2(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    request(true, method, url, headers, body).await
}

/// Sends one HTTP/1.1 request; the error, as text, when no answer came (the connection was
/// refused, reset or closed).
pub async fn try_send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Reply, String> {
    try_request(false, method, url, headers, body)
        .await
        .map_err(|e| format!("{e:?}"))
}

/// Polls `url` with GET until it answers `status`, for at most `within`; whether it did.
pub async fn answers_within(url: &str, status: u16, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if try_send("GET", url, &[], "")
            .await
            .is_ok_and(|reply| reply.status == status)
        {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    false
}

/// Sends one HTTP/2 request with prior knowledge; `None` when the connection or the stream failed
/// (a reset stream, say) instead of answering.
pub async fn try_send_h2(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<Reply> {
    try_request(true, method, url, headers, body).await.ok()
}

async fn request(h2: bool, method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    try_request(h2, method, url, headers, body)
        .await
        .unwrap_or_else(|e| panic!("gateway answers: {e}"))
}

async fn try_request(
    h2: bool,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(h2)
        .build_http::<Full<Bytes>>();
    let mut builder = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let response = client.request(request).await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}
