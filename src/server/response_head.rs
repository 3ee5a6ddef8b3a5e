//! An HTTP/1.x response head written to a client, for the gateway's own HTTP/1 server (issue
//! 37): the bytes hyper's server writes for the same response (status line, the fields in the
//! map's order with hyper's merging of the framing fields, `date`), and how the body after it is
//! framed and whether the connection closes after it.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

use super::field_values::{digits, has_token, last_coding_is_chunked};

/// The request a response answers, as far as its head depends on it.
#[derive(Debug, Clone, Copy)]
pub struct Answering<'a> {
    pub method: &'a Method,
    /// The request's version: an HTTP/1.0 client is answered in HTTP/1.0.
    pub version: Version,
    /// Whether the request let the connection stay open.
    pub keep_alive: bool,
}

/// What is known of a response body before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodySize {
    /// It has ended already (no data).
    Ended,
    /// Exactly this many bytes.
    Known(u64),
    Unknown,
}

/// How the body after a head is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// Exactly this many bytes (none where the response can have no body).
    Length(u64),
    Chunked,
    /// Until the connection closes.
    UntilClose,
}

/// A head written: its body's framing, whether the connection closes after the exchange, and the
/// trailer fields its `trailer` field declares (a chunked body only: `None` without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub framing: BodyFraming,
    pub last: bool,
    pub trailers: Option<Vec<HeaderName>>,
}

/// A response's status code and, when an upstream sent one that is not the code's usual, its
/// reason phrase (written as sent, as hyper's server writes its `ReasonPhrase` extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status<'a> {
    pub code: StatusCode,
    pub reason: Option<&'a [u8]>,
}

impl From<StatusCode> for Status<'_> {
    fn from(code: StatusCode) -> Self {
        Status { code, reason: None }
    }
}

/// A response hyper's server would not write (it closes the connection instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResponseRefused {
    #[error("the response's framing fields contradict each other or its body")]
    Framing,
    #[error("a 1xx status cannot be a final response")]
    Informational,
}

/// Appends the head of a response to `dst` (nothing on an error): `version` is the response's own
/// (an upstream's HTTP/1.0 answer stays HTTP/1.0), and `date` the value of the `date` field
/// written when `headers` have none.
pub fn write_response_head<'s>(
    dst: &mut Vec<u8>,
    answering: Answering<'_>,
    status: impl Into<Status<'s>>,
    mut version: Version,
    mut headers: HeaderMap,
    body: BodySize,
    date: &[u8],
) -> Result<Written, ResponseRefused> {
    let Status {
        code: status,
        reason,
    } = status.into();
    let mut keep_alive = answering.keep_alive;
    if answering.version == Version::HTTP_10 {
        // An HTTP/1.0 client is told that the connection stays open, or it is closed.
        let says_keep_alive = headers
            .get_all(header::CONNECTION)
            .iter()
            .any(|value| has_token(value, "keep-alive"));
        if !says_keep_alive {
            if version == Version::HTTP_10 {
                keep_alive = false;
            } else if keep_alive {
                headers.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
            }
        }
        version = Version::HTTP_10;
    } else if !keep_alive {
        let says_close = headers
            .get_all(header::CONNECTION)
            .iter()
            .any(|value| has_token(value, "close"));
        if !says_close {
            headers.append(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
    let connect_success = *answering.method == Method::CONNECT && status.is_success();
    if status == StatusCode::SWITCHING_PROTOCOLS || connect_success {
        keep_alive = false;
    } else if status.is_informational() {
        return Err(ResponseRefused::Informational);
    }
    let start = dst.len();
    let status_line = StatusLine {
        method: answering.method,
        version,
        status,
        reason,
    };
    let fields = Fields {
        last: !keep_alive,
        wrote_length: connect_success,
    };
    let written = write_fields(dst, status_line, headers, body, date, fields);
    if written.is_err() {
        dst.truncate(start);
    }
    written
}

/// The status line to write, and the method it answers.
#[derive(Clone, Copy)]
struct StatusLine<'a> {
    method: &'a Method,
    version: Version,
    status: StatusCode,
    reason: Option<&'a [u8]>,
}

/// Where the framing fields stand while the fields are written.
struct Fields {
    last: bool,
    wrote_length: bool,
}

fn write_fields(
    dst: &mut Vec<u8>,
    line: StatusLine<'_>,
    headers: HeaderMap,
    body: BodySize,
    date: &[u8],
    mut state: Fields,
) -> Result<Written, ResponseRefused> {
    let StatusLine {
        method,
        version,
        status,
        reason,
    } = line;
    if version == Version::HTTP_11 && status == StatusCode::OK && reason.is_none() {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        dst.extend_from_slice(if version == Version::HTTP_10 {
            b"HTTP/1.0 "
        } else {
            b"HTTP/1.1 "
        });
        dst.extend_from_slice(status.as_str().as_bytes());
        dst.push(b' ');
        match reason {
            Some(reason) => dst.extend_from_slice(reason),
            None => dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
        }
        dst.extend_from_slice(b"\r\n");
    }
    let chunkable = version == Version::HTTP_11 && can_have_body(method, status);
    let mut framing = BodyFraming::Length(0);
    let mut wrote_date = false;
    // A merged field (framing, `connection`, `trailer`) whose line is still open.
    let mut open_line = false;
    let mut must_add_chunked = false;
    let mut earlier_length: Option<u64> = None;
    let mut trailers: Option<Vec<HeaderName>> = None;
    let mut current: Option<HeaderName> = None;
    for (name, value) in headers {
        if let Some(name) = name {
            close_line(dst, &mut open_line, must_add_chunked);
            current = Some(name);
        }
        let Some(name) = current.as_ref() else {
            continue;
        };
        match *name {
            header::CONTENT_LENGTH => {
                if state.wrote_length && !open_line {
                    return Err(ResponseRefused::Framing);
                }
                match body {
                    BodySize::Known(known) => {
                        if !open_line {
                            framing = BodyFraming::Length(known);
                            start_line(dst, b"content-length: ", value.as_bytes());
                            state.wrote_length = true;
                            open_line = true;
                        }
                        continue;
                    }
                    BodySize::Unknown => {
                        let length = digits(value.as_bytes()).ok_or(ResponseRefused::Framing)?;
                        match earlier_length {
                            Some(earlier) if earlier != length => {
                                return Err(ResponseRefused::Framing)
                            }
                            Some(_) => {}
                            None => {
                                framing = BodyFraming::Length(length);
                                start_line(dst, b"content-length: ", value.as_bytes());
                                state.wrote_length = true;
                                open_line = true;
                                earlier_length = Some(length);
                            }
                        }
                        continue;
                    }
                    BodySize::Ended if *method != Method::HEAD => continue,
                    // The length of the body a GET would have had.
                    BodySize::Ended => state.wrote_length = true,
                }
            }
            header::TRANSFER_ENCODING => {
                if state.wrote_length && !open_line {
                    return Err(ResponseRefused::Framing);
                }
                if !chunkable {
                    continue;
                }
                state.wrote_length = true;
                must_add_chunked = !last_coding_is_chunked(&value);
                if open_line {
                    dst.extend_from_slice(b", ");
                    dst.extend_from_slice(value.as_bytes());
                } else {
                    framing = BodyFraming::Chunked;
                    start_line(dst, b"transfer-encoding: ", value.as_bytes());
                    open_line = true;
                }
                continue;
            }
            header::CONNECTION => {
                state.last |= has_token(&value, "close");
                merge_line(dst, &mut open_line, b"connection: ", value.as_bytes());
                continue;
            }
            header::TRAILER => {
                if !chunkable {
                    continue;
                }
                merge_line(dst, &mut open_line, b"trailer: ", value.as_bytes());
                let names = value.to_str().unwrap_or_default().split(',');
                trailers.get_or_insert_with(Vec::new).extend(
                    names.filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok()),
                );
                continue;
            }
            header::DATE => wrote_date = true,
            _ => {}
        }
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    close_line(dst, &mut open_line, must_add_chunked);
    if !state.wrote_length {
        framing = match body {
            BodySize::Unknown if chunkable => {
                dst.extend_from_slice(b"transfer-encoding: chunked\r\n");
                BodyFraming::Chunked
            }
            BodySize::Unknown => BodyFraming::UntilClose,
            BodySize::Ended | BodySize::Known(0) => {
                if can_have_length(method, status) && *method != Method::HEAD {
                    dst.extend_from_slice(b"content-length: 0\r\n");
                }
                BodyFraming::Length(0)
            }
            BodySize::Known(length) if can_have_length(method, status) => {
                dst.extend_from_slice(b"content-length: ");
                dst.extend_from_slice(length.to_string().as_bytes());
                dst.extend_from_slice(b"\r\n");
                BodyFraming::Length(length)
            }
            BodySize::Known(_) => BodyFraming::Length(0),
        };
    }
    if !can_have_body(method, status) {
        framing = BodyFraming::Length(0);
    }
    if !wrote_date {
        dst.extend_from_slice(b"date: ");
        dst.extend_from_slice(date);
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
    let last = state.last || framing == BodyFraming::UntilClose;
    let trailers = trailers.filter(|_| framing == BodyFraming::Chunked);
    Ok(Written {
        framing,
        last,
        trailers,
    })
}

fn start_line(dst: &mut Vec<u8>, name_with_colon: &[u8], value: &[u8]) {
    dst.extend_from_slice(name_with_colon);
    dst.extend_from_slice(value);
}

/// Starts `name_with_colon`'s line, or adds `value` to it when it is the open one.
fn merge_line(dst: &mut Vec<u8>, open_line: &mut bool, name_with_colon: &[u8], value: &[u8]) {
    if *open_line {
        dst.extend_from_slice(b", ");
        dst.extend_from_slice(value);
    } else {
        start_line(dst, name_with_colon, value);
        *open_line = true;
    }
}

/// Ends a merged line, adding `chunked` where the codings named did not end with it.
fn close_line(dst: &mut Vec<u8>, open_line: &mut bool, must_add_chunked: bool) {
    if std::mem::take(open_line) {
        if must_add_chunked {
            dst.extend_from_slice(b", chunked\r\n");
        } else {
            dst.extend_from_slice(b"\r\n");
        }
    }
}

/// Whether a response to `method` with `status` has a body (and may be chunked).
fn can_have_body(method: &Method, status: StatusCode) -> bool {
    !(*method == Method::HEAD
        || (*method == Method::CONNECT && status.is_success())
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED)
}

/// Whether a response to `method` with `status` may carry a `Content-Length`.
fn can_have_length(method: &Method, status: StatusCode) -> bool {
    !(status.is_informational()
        || (*method == Method::CONNECT && status.is_success())
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &[u8] = b"Sun, 06 Dec 2026 00:00:00 GMT";

    fn write(
        answering: Answering<'_>,
        headers: &[(&'static str, &'static str)],
        body: BodySize,
    ) -> (String, Result<Written, ResponseRefused>) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_static(value));
        }
        let mut dst = b"before".to_vec();
        let written = write_response_head(
            &mut dst,
            answering,
            StatusCode::OK,
            Version::HTTP_11,
            map,
            body,
            DATE,
        );
        (String::from_utf8_lossy(&dst).into_owned(), written)
    }

    #[test]
    fn an_http_1_0_client_kept_alive_is_told_so() {
        let answering = Answering {
            method: &Method::GET,
            version: Version::HTTP_10,
            keep_alive: true,
        };
        let (head, written) = write(answering, &[], BodySize::Known(2));
        assert_eq!(
            head,
            "beforeHTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\
             date: Sun, 06 Dec 2026 00:00:00 GMT\r\n\r\n"
        );
        assert_eq!(
            written,
            Ok(Written {
                framing: BodyFraming::Length(2),
                last: false,
                trailers: None,
            })
        );
        let (_, streamed) = write(answering, &[], BodySize::Unknown);
        assert_eq!(
            streamed,
            Ok(Written {
                framing: BodyFraming::UntilClose,
                last: true,
                trailers: None,
            })
        );
    }

    #[test]
    fn contradicting_framing_fields_write_nothing() {
        let answering = Answering {
            method: &Method::GET,
            version: Version::HTTP_11,
            keep_alive: true,
        };
        let (head, written) = write(
            answering,
            &[("content-length", "2"), ("transfer-encoding", "chunked")],
            BodySize::Unknown,
        );
        assert_eq!(written, Err(ResponseRefused::Framing));
        assert_eq!(head, "before");
    }
}
