//! RFC 9457 problem details: the machine-readable body of every refusal the gateway answers.

use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;

use crate::body::{full_body, ProxyBody};

/// Where the problem types live; each case appends its stable slug (`.../stale-fence`).
pub const PROBLEM_TYPE_BASE: &str = "https://fencegate.dev/problems/";

/// Room for a document's member names, numbers and punctuation, beyond its strings.
const PROBLEM_BODY_BASE: usize = 160;

/// A problem document. Optional members appear only when they help the client.
#[derive(Debug, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_fence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_advance: Option<u64>,
}

impl Problem {
    pub fn new(status: StatusCode, slug: &str, title: &'static str, detail: String) -> Problem {
        Problem {
            problem_type: [PROBLEM_TYPE_BASE, slug].concat(),
            title,
            status: status.as_u16(),
            detail,
            route: None,
            key: None,
            fence: None,
            current_fence: None,
            max_advance: None,
        }
    }

    /// Bytes of the document's strings, before JSON escaping.
    fn text_len(&self) -> usize {
        self.problem_type.len()
            + self.title.len()
            + self.detail.len()
            + self.route.as_ref().map_or(0, String::len)
            + self.key.as_ref().map_or(0, String::len)
    }

    /// The document as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // Sized for the whole document up front: growing the buffer as serde_json writes cost
        // a fifth of a refusal's instructions (callgrind, stale-token refusals).
        let mut body = Vec::with_capacity(PROBLEM_BODY_BASE + self.text_len());
        if serde_json::to_writer(&mut body, self).is_err() {
            body = b"{}".to_vec();
        }
        body
    }

    /// The response carrying this document.
    pub fn into_response(self) -> Response<ProxyBody> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = Response::new(full_body(self.to_json()));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}
