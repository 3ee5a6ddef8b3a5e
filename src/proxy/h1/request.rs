//! A request as it goes on the wire: how its body is framed (the rules hyper's client applies, so
//! upstreams see what they saw before), and its head's bytes.

use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::Method;
use http_body::Body as _;

use super::head::{content_length, last_coding_is_chunked};
use crate::body::RequestBody;

/// How a request's body is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// Exactly this many bytes (none for a request without a body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Decides the framing of `body` under `parts`' headers, setting `Content-Length` or
/// `Transfer-Encoding` as it needs: a body that has ended is sent as nothing (under its
/// `Content-Length`, which the sending then checks); a
/// `Transfer-Encoding` present makes it chunked (and `Content-Length` goes); a valid
/// `Content-Length` present is kept; a body of known size gets its `Content-Length`; any other
/// body is chunked, except on GET, HEAD and CONNECT, which are sent without one.
pub fn frame_request(parts: &mut Parts, body: &RequestBody) -> RequestFraming {
    let headers = &mut parts.headers;
    if body.is_end_stream() {
        headers.remove(header::TRANSFER_ENCODING);
        // A `Content-Length` that promises bytes an ended body does not have is kept, so that the
        // sending fails on it rather than the upstream reading the next request as this body.
        if let Ok(Some(declared)) = content_length(headers) {
            return RequestFraming::Length(declared);
        }
        return RequestFraming::Length(0);
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if !last_coding_is_chunked(headers) {
            headers.append(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        headers.remove(header::CONTENT_LENGTH);
        return RequestFraming::Chunked;
    }
    if let Ok(Some(declared)) = content_length(headers) {
        return RequestFraming::Length(declared);
    }
    if let Some(exact) = body.size_hint().exact() {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(exact));
        return RequestFraming::Length(exact);
    }
    if matches!(parts.method, Method::GET | Method::HEAD | Method::CONNECT) {
        return RequestFraming::Length(0);
    }
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    RequestFraming::Chunked
}

/// Appends the request line and `headers` to `out`: `METHOD target HTTP/1.1`, each field as
/// `name: value`, then the empty line.
pub fn encode_head(out: &mut Vec<u8>, parts: &Parts) {
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    encode_fields(out, &parts.headers);
    out.extend_from_slice(b"\r\n");
}

fn encode_fields(out: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// The size line of a chunk of `len` bytes, after the line end that closes the chunk before it.
pub fn chunk_start(out: &mut Vec<u8>, len: usize, after_chunk: bool) {
    if after_chunk {
        out.extend_from_slice(b"\r\n");
    }
    // Hexadecimal by hand: `write!` through `fmt` for a handful of digits costs more than this.
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut rest = len;
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[rest % 16];
        rest /= 16;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk and the empty trailer section.
pub fn chunked_end(out: &mut Vec<u8>, after_chunk: bool) {
    if after_chunk {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt as _, StreamBody};

    use super::*;

    fn streamed() -> RequestBody {
        let frames = futures_util::stream::iter(vec![Ok::<_, crate::body::BoxError>(
            http_body::Frame::data(Bytes::from_static(b"abc")),
        )]);
        RequestBody::unlimited(StreamBody::new(frames).boxed())
    }

    fn parts(method: Method, headers: &[(&str, &str)]) -> Parts {
        let mut builder = Request::builder().method(method).uri("/a?b=c");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).expect("request").into_parts().0
    }

    #[test]
    fn framing_follows_the_headers_then_the_body() {
        let mut empty = parts(Method::POST, &[("transfer-encoding", "chunked")]);
        assert_eq!(
            frame_request(&mut empty, &RequestBody::full(Bytes::new())),
            RequestFraming::Length(0)
        );
        assert!(!empty.headers.contains_key("transfer-encoding"));

        let mut both = parts(
            Method::POST,
            &[("transfer-encoding", "gzip"), ("content-length", "3")],
        );
        assert_eq!(
            frame_request(&mut both, &streamed()),
            RequestFraming::Chunked
        );
        assert!(!both.headers.contains_key("content-length"));
        assert!(last_coding_is_chunked(&both.headers));

        let mut declared = parts(Method::PUT, &[("content-length", "3")]);
        assert_eq!(
            frame_request(&mut declared, &streamed()),
            RequestFraming::Length(3)
        );

        let mut known = parts(Method::PUT, &[]);
        assert_eq!(
            frame_request(&mut known, &RequestBody::full(Bytes::from_static(b"hello"))),
            RequestFraming::Length(5)
        );
        assert_eq!(known.headers["content-length"], "5");

        let mut unknown = parts(Method::POST, &[("content-length", "x")]);
        assert_eq!(
            frame_request(&mut unknown, &streamed()),
            RequestFraming::Chunked
        );
        assert!(!unknown.headers.contains_key("content-length"));
        assert_eq!(unknown.headers["transfer-encoding"], "chunked");

        let mut get = parts(Method::GET, &[]);
        assert_eq!(
            frame_request(&mut get, &streamed()),
            RequestFraming::Length(0)
        );
    }

    #[test]
    fn the_head_is_the_request_line_and_each_field() {
        let parts = parts(Method::POST, &[("host", "up"), ("x-fence", "7")]);
        let mut out = Vec::new();
        encode_head(&mut out, &parts);
        assert_eq!(
            out,
            b"POST /a?b=c HTTP/1.1\r\nhost: up\r\nx-fence: 7\r\n\r\n".to_vec()
        );
    }

    #[test]
    fn chunk_size_lines_are_lowercase_hex_after_the_previous_chunk_end() {
        let mut out = Vec::new();
        chunk_start(&mut out, 0x1a2f, false);
        chunk_start(&mut out, 1, true);
        chunked_end(&mut out, true);
        assert_eq!(out, b"1a2f\r\n\r\n1\r\n\r\n0\r\n\r\n".to_vec());
    }
}
