//! An HTTP/1.x request head read off a client connection, for the gateway's own HTTP/1 server
//! (issue 37): parsed by httparse (hyper's parser) with the rules of hyper's server, into `http`'s
//! types without copying the field values, with how its body is framed, whether the connection
//! stays open after it, and the status a head that cannot be served is refused with.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri, Version};

use super::field_values::{digits, has_token, last_coding_is_chunked};

/// The most header fields a request head may carry (hyper's server limit).
pub const MAX_REQUEST_HEADERS: usize = 100;
/// The largest `Content-Length` served (hyper's bound); a larger one is refused with 431.
const MAX_BODY_LENGTH: u64 = u64::MAX - 2;
/// Fields the gateway adds to a request before it forwards it: `x-forwarded-for`,
/// `x-forwarded-proto`, `x-forwarded-host`, `forwarded`, `via`, `x-request-id`, and two to spare.
const ADDED_FIELDS: usize = 8;
/// The longest request target served (hyper's limit); a longer one is refused with 414.
pub const MAX_URI_LEN: usize = u16::MAX as usize - 1;

/// How a request's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// Exactly this many bytes (none without a `Content-Length` or `Transfer-Encoding`).
    Length(u64),
    Chunked,
}

/// A whole request head.
#[derive(Debug)]
pub struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: RequestFraming,
    /// Whether the connection may carry another request after this one.
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before it sends the body.
    pub expect_continue: bool,
    /// `CONNECT`, or an HTTP/1.1 head with an `Upgrade` field.
    pub wants_upgrade: bool,
    /// The client accepts trailers after a chunked response (`TE: trailers`).
    pub accepts_trailers: bool,
    /// The head carries both `Transfer-Encoding` and `Content-Length`: two readers could frame
    /// its body differently (the chunked coding wins here, and the connection closes after it).
    pub both_lengths: bool,
}

impl RequestHead {
    /// The head as an `http` request with `body`.
    pub fn into_request<B>(self, body: B) -> Request<B> {
        let mut request = Request::new(body);
        *request.method_mut() = self.method;
        *request.uri_mut() = self.uri;
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers;
        request
    }
}

/// Why a request head cannot be served; the connection closes after the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadRefused {
    #[error("the request head is malformed: {0}")]
    Malformed(&'static str),
    #[error("the request head is larger than the limit, or has too many fields")]
    TooLarge,
    #[error("the request target is longer than {MAX_URI_LEN} bytes")]
    UriTooLong,
}

impl HeadRefused {
    /// The status hyper's server answers the same head with.
    pub fn status(self) -> StatusCode {
        match self {
            HeadRefused::Malformed(_) => StatusCode::BAD_REQUEST,
            HeadRefused::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadRefused::UriTooLong => StatusCode::URI_TOO_LONG,
        }
    }
}

/// Parses the request head at the start of `buffer`, taking its bytes out of it: `None` while the
/// head is not whole and `buffer` holds fewer than `max_head_bytes` bytes. At most
/// [`MAX_REQUEST_HEADERS`] fields.
pub fn parse_request_head(
    buffer: &mut BytesMut,
    max_head_bytes: usize,
) -> Result<Option<RequestHead>, HeadRefused> {
    parse_request_head_within(buffer, max_head_bytes, MAX_REQUEST_HEADERS)
}

/// [`parse_request_head`] with at most `max_headers` fields (more are refused as too large).
pub fn parse_request_head_within(
    buffer: &mut BytesMut,
    max_head_bytes: usize,
    max_headers: usize,
) -> Result<Option<RequestHead>, HeadRefused> {
    let scanned = if max_headers <= MAX_REQUEST_HEADERS {
        // hyper's way too: the fields on the stack up to its default limit.
        let mut fields =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_REQUEST_HEADERS];
        scan(buffer, max_head_bytes, &mut fields[..max_headers])?
    } else {
        let mut fields = Vec::new();
        fields.resize_with(max_headers, MaybeUninit::uninit);
        scan(buffer, max_head_bytes, &mut fields)?
    };
    let Some(scanned) = scanned else {
        return Ok(None);
    };
    let method = Method::from_bytes(&buffer[scanned.method.0..scanned.method.1])
        .map_err(|_| HeadRefused::Malformed("the method is invalid"))?;
    let version = scanned.version;
    let bytes: Bytes = buffer.split_to(scanned.length).freeze();
    let uri = Uri::from_maybe_shared(bytes.slice(scanned.target.0..scanned.target.1))
        .map_err(|_| HeadRefused::Malformed("the target is invalid"))?;
    let mut reading = Framing::new(version, &method);
    // Room for the fields the gateway adds before forwarding (the forwarded chain, `via`, the
    // request id), so that the map is not grown on the way.
    let mut headers = HeaderMap::with_capacity(scanned.fields.len() + ADDED_FIELDS);
    for ((name_start, name_end), (value_start, value_end)) in scanned.fields {
        let name = HeaderName::from_bytes(&bytes[name_start..name_end])
            .map_err(|_| HeadRefused::Malformed("a header name is invalid"))?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(value_start..value_end))
            .map_err(|_| HeadRefused::Malformed("a header value is invalid"))?;
        if reading.field(&name, &value)? {
            headers.append(name, value);
        }
    }
    reading.finish(method, uri, version, headers)
}

/// Where the parts of a whole head lie in the buffer.
struct Scanned {
    length: usize,
    method: (usize, usize),
    target: (usize, usize),
    version: Version,
    /// Each field's name and value.
    fields: Vec<((usize, usize), (usize, usize))>,
}

/// Runs httparse over `buffer` with room for `fields.len()` fields.
fn scan<'b>(
    buffer: &'b [u8],
    max_head_bytes: usize,
    fields: &mut [MaybeUninit<httparse::Header<'b>>],
) -> Result<Option<Scanned>, HeadRefused> {
    let mut request = httparse::Request::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        buffer,
        fields,
    );
    let length = match parsed {
        // A head longer than the limit can arrive whole in one read after a body's bytes; hyper,
        // whose read buffer is bounded by the limit, never parses one.
        Ok(httparse::Status::Complete(length)) if length > max_head_bytes => {
            return Err(HeadRefused::TooLarge)
        }
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if buffer.len() >= max_head_bytes => {
            return Err(HeadRefused::TooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadRefused::TooLarge),
        Err(httparse::Error::Token) if request.method.is_none() => {
            return Err(HeadRefused::Malformed("the method is invalid"))
        }
        Err(httparse::Error::Token) => return Err(HeadRefused::Malformed("the target is invalid")),
        Err(httparse::Error::Version) => {
            return Err(HeadRefused::Malformed("the version is not HTTP/1.x"))
        }
        Err(_) => return Err(HeadRefused::Malformed("a header field is invalid")),
    };
    // httparse completed: the method, target and version are there.
    let (Some(method), Some(target)) = (request.method, request.path) else {
        return Err(HeadRefused::Malformed("the request line is incomplete"));
    };
    if target.len() > MAX_URI_LEN {
        return Err(HeadRefused::UriTooLong);
    }
    let base = buffer.as_ptr() as usize;
    Ok(Some(Scanned {
        length,
        method: span(base, method.as_bytes()),
        target: span(base, target.as_bytes()),
        version: match request.version {
            Some(1) => Version::HTTP_11,
            _ => Version::HTTP_10,
        },
        fields: request
            .headers
            .iter()
            .map(|field| (span(base, field.name.as_bytes()), span(base, field.value)))
            .collect(),
    }))
}

/// The byte range of `part` within the buffer starting at `base`.
fn span(base: usize, part: &[u8]) -> (usize, usize) {
    let start = part.as_ptr() as usize - base;
    (start, start + part.len())
}

/// What the framing fields of a head have said so far, read in order as hyper reads them.
struct Framing {
    version: Version,
    framing: RequestFraming,
    content_length: Option<u64>,
    saw_length: bool,
    saw_coding: bool,
    chunked: bool,
    keep_alive: bool,
    saw_close: bool,
    expect_continue: bool,
    wants_upgrade: bool,
    accepts_trailers: bool,
}

impl Framing {
    fn new(version: Version, method: &Method) -> Framing {
        Framing {
            version,
            framing: RequestFraming::Length(0),
            content_length: None,
            saw_length: false,
            saw_coding: false,
            chunked: false,
            keep_alive: version == Version::HTTP_11,
            saw_close: false,
            expect_continue: false,
            wants_upgrade: method == Method::CONNECT,
            accepts_trailers: false,
        }
    }

    /// Takes in one field; whether it stays in the head (a `Content-Length` after a
    /// `Transfer-Encoding`, or repeating an earlier one, does not).
    fn field(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<bool, HeadRefused> {
        match *name {
            header::TRANSFER_ENCODING => {
                if self.version != Version::HTTP_11 {
                    return Err(HeadRefused::Malformed(
                        "Transfer-Encoding in an HTTP/1.0 request",
                    ));
                }
                self.saw_coding = true;
                self.content_length = None;
                self.chunked = last_coding_is_chunked(value);
                if self.chunked {
                    self.framing = RequestFraming::Chunked;
                }
            }
            header::CONTENT_LENGTH => {
                self.saw_length = true;
                if self.saw_coding {
                    return Ok(false);
                }
                let length = digits(value.as_bytes())
                    .ok_or(HeadRefused::Malformed("the Content-Length is invalid"))?;
                if length > MAX_BODY_LENGTH {
                    return Err(HeadRefused::TooLarge);
                }
                match self.content_length {
                    Some(earlier) if earlier != length => {
                        return Err(HeadRefused::Malformed("two Content-Length fields disagree"))
                    }
                    // hyper keeps one of equal lengths.
                    Some(_) => return Ok(false),
                    None => {
                        self.content_length = Some(length);
                        self.framing = RequestFraming::Length(length);
                    }
                }
            }
            header::CONNECTION => {
                if self.saw_close || has_token(value, "close") {
                    self.saw_close = true;
                    self.keep_alive = false;
                } else if !self.keep_alive {
                    self.keep_alive = has_token(value, "keep-alive");
                }
            }
            header::EXPECT => {
                self.expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
            }
            header::UPGRADE => self.wants_upgrade = self.version == Version::HTTP_11,
            header::TE => self.accepts_trailers |= has_token(value, "trailers"),
            _ => {}
        }
        Ok(true)
    }

    fn finish(
        self,
        method: Method,
        uri: Uri,
        version: Version,
        mut headers: HeaderMap,
    ) -> Result<Option<RequestHead>, HeadRefused> {
        if self.saw_coding && !self.chunked {
            return Err(HeadRefused::Malformed(
                "the last transfer coding is not chunked",
            ));
        }
        let both_lengths = self.saw_coding && self.saw_length;
        if both_lengths {
            // A length read before the coding was kept in the map: the coding frames the body.
            headers.remove(header::CONTENT_LENGTH);
        }
        Ok(Some(RequestHead {
            method,
            uri,
            version,
            headers,
            framing: self.framing,
            keep_alive: self.keep_alive && !both_lengths,
            expect_continue: self.expect_continue,
            wants_upgrade: self.wants_upgrade,
            accepts_trailers: self.accepts_trailers,
            both_lengths,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 16 * 1024;

    fn parse(head: &str) -> Result<Option<RequestHead>, HeadRefused> {
        parse_request_head(&mut BytesMut::from(head.as_bytes()), LIMIT)
    }

    fn whole(head: &str) -> RequestHead {
        match parse(head) {
            Ok(Some(head)) => head,
            other => panic!("{head:?} did not parse whole: {other:?}"),
        }
    }

    fn refused(head: &str) -> StatusCode {
        match parse(head) {
            Err(refused) => refused.status(),
            other => panic!("{head:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn a_plain_head_takes_its_bytes_and_leaves_the_next() {
        let mut buffer = BytesMut::from(&b"GET /a?b HTTP/1.1\r\nHost: x\r\n\r\nGET /next"[..]);
        let head = parse_request_head(&mut buffer, LIMIT).unwrap().unwrap();
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.uri, "/a?b");
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(head.headers["host"], "x");
        assert_eq!(head.framing, RequestFraming::Length(0));
        assert!(head.keep_alive && !head.expect_continue && !head.wants_upgrade);
        assert_eq!(&buffer[..], b"GET /next");
    }

    #[test]
    fn a_partial_head_waits_until_the_limit() {
        assert!(parse("GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
        let long = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(LIMIT));
        assert_eq!(refused(&long), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }

    #[test]
    fn framing_follows_hypers_server() {
        let length = whole("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(length.framing, RequestFraming::Length(5));
        assert_eq!(
            length
                .headers
                .get_all(header::CONTENT_LENGTH)
                .iter()
                .count(),
            1
        );
        let chunked = whole("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n");
        assert_eq!(chunked.framing, RequestFraming::Chunked);
        assert!(!chunked.both_lengths && chunked.keep_alive);
        let both =
            whole("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(both.framing, RequestFraming::Chunked);
        assert!(both.both_lengths && !both.keep_alive);
        assert!(both.headers.get(header::CONTENT_LENGTH).is_none());
        let after =
            whole("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n");
        assert!(after.both_lengths && after.headers.get(header::CONTENT_LENGTH).is_none());
    }

    #[test]
    fn heads_hyper_refuses_are_refused_with_its_status() {
        let bad = StatusCode::BAD_REQUEST;
        for head in [
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.2\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "G(T / HTTP/1.1\r\n\r\n",
            "GET /a b HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET / HTTP/1.1\r\nX: a\0b\r\n\r\n",
        ] {
            assert_eq!(refused(head), bad, "{head:?}");
        }
        assert_eq!(
            refused("POST / HTTP/1.1\r\nContent-Length: 18446744073709551614\r\n\r\n"),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let many: String = (0..=MAX_REQUEST_HEADERS)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert_eq!(
            refused(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let target = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI_LEN));
        let refusal = parse_request_head(&mut BytesMut::from(target.as_bytes()), 1 << 20);
        assert_eq!(refusal.unwrap_err().status(), StatusCode::URI_TOO_LONG);
    }

    #[test]
    fn the_connection_stays_open_as_hyper_decides() {
        assert!(!whole("GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n").keep_alive);
        assert!(
            !whole("GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n")
                .keep_alive
        );
        assert!(!whole("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(whole("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(whole("GET / HTTP/1.1\r\nExpect: 100-Continue\r\n\r\n").expect_continue);
        assert!(!whole("GET / HTTP/1.1\r\nExpect: 100-continue, x\r\n\r\n").expect_continue);
        assert!(whole("GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n").wants_upgrade);
        assert!(!whole("GET / HTTP/1.0\r\nUpgrade: websocket\r\n\r\n").wants_upgrade);
        assert!(whole("CONNECT a:443 HTTP/1.1\r\n\r\n").wants_upgrade);
        assert!(whole("GET / HTTP/1.1\r\nTE: gzip\r\nTE: Trailers\r\n\r\n").accepts_trailers);
        assert!(!whole("GET / HTTP/1.1\r\nTE: gzip\r\n\r\n").accepts_trailers);
    }

    #[test]
    fn leading_blank_lines_and_lenient_heads_parse_as_hyper_parses_them() {
        let head = whole("\r\n\r\nGET / HTTP/1.1\nHost: x\n\n");
        assert_eq!(head.headers["host"], "x");
        let obs = whole("GET / HTTP/1.1\r\nX: caf\u{e9}\r\n\r\n");
        assert_eq!(obs.headers["x"].as_bytes(), "caf\u{e9}".as_bytes());
        assert_eq!(whole("OPTIONS * HTTP/1.1\r\n\r\n").uri, "*");
    }
}
