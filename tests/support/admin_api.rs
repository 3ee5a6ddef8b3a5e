//! The admin API as an operator's tool calls it: bearer-authenticated JSON calls to one gateway's
//! admin listener, intent keys percent-encoded into their path segment, and series read back from
//! the Prometheus exposition.

use super::client::{send, Reply};
use super::gateway::TestGateway;

/// One gateway's admin listener, called with a bearer token.
pub struct AdminApi {
    base: String,
    authorization: String,
}

impl AdminApi {
    /// The admin API of `gw`, which must have an admin listener with `token`.
    pub fn of(gw: &TestGateway, token: &str) -> AdminApi {
        AdminApi {
            base: gw.admin_url(""),
            authorization: format!("Bearer {token}"),
        }
    }

    /// `method path` with the token and `body` as JSON.
    pub async fn call(&self, method: &str, path: &str, body: &str) -> Reply {
        let headers = [
            ("authorization", self.authorization.as_str()),
            ("content-type", "application/json"),
        ];
        send(method, &format!("{}{path}", self.base), &headers, body).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.call("GET", path, "").await
    }

    /// `GET /admin/intents/{key}`.
    pub async fn intent(&self, key: &str) -> Reply {
        self.get(&format!("/admin/intents/{}", encode_segment(key)))
            .await
    }

    /// `POST /admin/intents/{key}/resolve` with `body`.
    pub async fn resolve(&self, key: &str, body: &str) -> Reply {
        let path = format!("/admin/intents/{}/resolve", encode_segment(key));
        self.call("POST", &path, body).await
    }

    /// The keys `GET /admin/intents?older_than=0s` lists, in its order.
    pub async fn submitting(&self) -> Vec<String> {
        let listed = self.get("/admin/intents?older_than=0s").await;
        assert_eq!(listed.status, 200, "listing intents: {:?}", listed.body);
        listed.json()["intents"]
            .as_array()
            .expect("an intents array")
            .iter()
            .map(|intent| intent["key"].as_str().expect("a key").to_owned())
            .collect()
    }

    /// `POST /admin/reload`.
    pub async fn reload(&self) -> Reply {
        self.call("POST", "/admin/reload", "").await
    }

    /// The `/metrics` exposition.
    pub async fn metrics(&self) -> String {
        let reply = self.get("/metrics").await;
        assert_eq!(reply.status, 200, "/metrics: {:?}", reply.body);
        String::from_utf8(reply.body.to_vec()).expect("the exposition is UTF-8")
    }
}

/// `text` percent-encoded as one path segment (RFC 3986 §2.1): every byte but the unreserved
/// characters, so an intent key's `/` travels as `%2F` and stays inside the segment.
pub fn encode_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of `series` (its name and labels exactly as exposed) in a Prometheus text exposition,
/// or `None` when the exposition does not have it.
pub fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
}
