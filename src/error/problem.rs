//! RFC 9457 problem details: the machine-readable body of every refusal the gateway answers.

use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;

use crate::body::{full_body, ProxyBody};

/// Where the problem types live; each case appends its stable slug (`.../stale-fence`).
pub const PROBLEM_TYPE_BASE: &str = "https://fencegate.dev/problems/";

/// The header fields a problem response carries at most before it is written.
const RESPONSE_FIELDS: usize = 4;

/// Room for a document's member names, numbers and punctuation, beyond its strings.
const PROBLEM_BODY_BASE: usize = 160;

/// Appends `text` as a JSON string, escaped as `serde_json` escapes it.
fn push_json_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    push_json_contents(out, text);
    out.push(b'"');
}

/// Appends `text` escaped as `serde_json` escapes a string's contents: `"` and `\`, the
/// control characters below 0x20 (`\b \t \n \f \r` by name, the rest as `\u00XX`), nothing
/// else. Runs of bytes that need no escape are copied whole.
fn push_json_contents(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    // Most strings need no escape: told by a scan without early exit, which the compiler turns
    // into wide compares, then copied whole.
    let needs_escape = bytes.iter().fold(false, |found, &b| {
        found | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !needs_escape {
        out.extend_from_slice(bytes);
        return;
    }
    let mut start = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let named: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if named.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0x0f)]);
        } else {
            out.extend_from_slice(named);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Appends a number in decimal.
fn push_number(out: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Serializes a problem's `type`: the base followed by its slug.
fn serialize_type<S: serde::Serializer>(
    slug: &&'static str,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&format_args!("{PROBLEM_TYPE_BASE}{slug}"))
}

/// A problem document. Optional members appear only when they help the client.
#[derive(Debug, Serialize)]
pub struct Problem {
    /// The type's slug; the document's `type` is `PROBLEM_TYPE_BASE` followed by it, written
    /// out only when the document is, so a refusal pays for no concatenation.
    #[serde(rename = "type", serialize_with = "serialize_type")]
    pub slug: &'static str,
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
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: String,
    ) -> Problem {
        Problem {
            slug,
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
        PROBLEM_TYPE_BASE.len()
            + self.slug.len()
            + self.title.len()
            + self.detail.len()
            + self.route.as_ref().map_or(0, String::len)
            + self.key.as_ref().map_or(0, String::len)
    }

    /// The document as JSON: the same bytes `serde_json` writes for it (a test holds the two
    /// together), written by hand because serde_json's string escaping, a byte at a time, was
    /// the largest single cost of a stale refusal (callgrind: 5.8 % of its instructions).
    pub fn to_json(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(PROBLEM_BODY_BASE + self.text_len());
        // The base needs no escape (a unit test holds it so): copied as it is.
        body.extend_from_slice(b"{\"type\":\"");
        body.extend_from_slice(PROBLEM_TYPE_BASE.as_bytes());
        push_json_contents(&mut body, self.slug);
        body.extend_from_slice(b"\",\"title\":");
        push_json_string(&mut body, self.title);
        body.extend_from_slice(b",\"status\":");
        push_number(&mut body, u64::from(self.status));
        body.extend_from_slice(b",\"detail\":");
        push_json_string(&mut body, &self.detail);
        if let Some(route) = &self.route {
            body.extend_from_slice(b",\"route\":");
            push_json_string(&mut body, route);
        }
        if let Some(key) = &self.key {
            body.extend_from_slice(b",\"key\":");
            push_json_string(&mut body, key);
        }
        let numbers = [
            (&b",\"fence\":"[..], self.fence),
            (&b",\"current_fence\":"[..], self.current_fence),
            (&b",\"max_advance\":"[..], self.max_advance),
        ];
        for (name, value) in numbers {
            if let Some(value) = value {
                body.extend_from_slice(name);
                push_number(&mut body, value);
            }
        }
        body.push(b'}');
        body
    }

    /// The response carrying this document.
    pub fn into_response(self) -> Response<ProxyBody> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = Response::new(full_body(self.to_json()));
        *response.status_mut() = status;
        // Room for what the answer carries: the type, one header of the error's own
        // (`Retry-After`, `X-Fence-Current` or `Allow`) and the request id.
        *response.headers_mut() = http::HeaderMap::with_capacity(RESPONSE_FIELDS);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, optional: bool) -> Problem {
        let mut problem = Problem::new(
            StatusCode::CONFLICT,
            "stale-fence",
            "Stale fencing token",
            format!("detail {text}"),
        );
        if optional {
            problem.route = Some(format!("route {text}"));
            problem.key = Some(text.to_owned());
            problem.fence = Some(0);
            problem.current_fence = Some(u64::MAX);
            problem.max_advance = Some(1_000_000);
        }
        problem
    }

    /// The problem type's base is copied into documents unescaped: it must need no escape.
    #[test]
    fn the_type_base_needs_no_escape() {
        let mut escaped = Vec::new();
        push_json_contents(&mut escaped, PROBLEM_TYPE_BASE);
        assert_eq!(escaped, PROBLEM_TYPE_BASE.as_bytes());
    }

    /// The hand-written document is byte for byte what serde_json writes, for every ASCII
    /// character (controls, quote, backslash, DEL), multi-byte UTF-8, and with and without the
    /// optional members.
    #[test]
    fn the_document_is_what_serde_json_writes() {
        let mut texts: Vec<String> = (0u8..=0x7f)
            .map(|b| format!("a{}b", char::from(b)))
            .collect();
        texts.extend(
            [
                "",
                "invoice:42",
                "\"quoted\" and \\back\\slashed",
                "tab\tnew\nline\r\u{8}\u{c}\u{0}\u{1f}",
                "é ü 中文 🦀 \u{2028}\u{2029}",
            ]
            .map(str::to_owned),
        );
        for text in &texts {
            for optional in [false, true] {
                let problem = sample(text, optional);
                let expected = serde_json::to_vec(&problem).expect("serde_json");
                assert_eq!(
                    String::from_utf8_lossy(&problem.to_json()),
                    String::from_utf8_lossy(&expected),
                    "{text:?}"
                );
            }
        }
    }
}
