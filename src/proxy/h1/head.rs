//! A response head read off an upstream connection: parsed by httparse (hyper's parser) into
//! `http`'s types without copying the field values, and the framing of the body after it
//! (RFC 9112 §6.3), refusing what two readers could frame differently.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

use super::{H1Error, MAX_RESPONSE_HEADERS};

/// How a response's body is delimited (none: HEAD, 204, 304, `Length(0)`; `UntilClose`: the
/// connection cannot be used again).
pub use crate::proxy::body_decoder::BodyFraming as ResponseFraming;

/// A final (non-1xx) response head.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    /// Set when the upstream's reason phrase is not the status code's usual one.
    pub reason: Option<hyper::ext::ReasonPhrase>,
    pub headers: HeaderMap,
    /// Whether the upstream keeps the connection open after this response.
    pub keep_alive: bool,
}

/// Where each field of a parsed head lies in the buffer: name and value ranges. Kept by the
/// connection between heads, so that neither it nor httparse's field array is allocated or
/// zeroed for each response.
pub type FieldSpans = Vec<(usize, usize, usize, usize)>;

/// What the start of `buffer` holds.
pub enum Parsed {
    /// Not yet a whole head.
    Partial,
    /// A whole 1xx head of this many bytes, to be skipped.
    Informational(usize),
    Final(ResponseHead),
}

/// Parses the head at the start of `buffer`, taking a final head's bytes out of it; `spans` is
/// scratch space.
pub fn parse_head(buffer: &mut BytesMut, spans: &mut FieldSpans) -> Result<Parsed, H1Error> {
    let mut fields =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buffer,
        &mut fields,
    );
    let length = match parsed {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(H1Error::Malformed("more than 100 header fields"))
        }
        Err(_) => return Err(H1Error::Malformed("the response head does not parse")),
    };
    let code = response.code.unwrap_or_default();
    if is_informational(code) {
        return Ok(Parsed::Informational(length));
    }
    let status = StatusCode::from_u16(code)
        .map_err(|_| H1Error::Malformed("the status code is out of range"))?;
    let version = if response.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let reason = response
        .reason
        .filter(|reason| Some(*reason) != status.canonical_reason())
        .and_then(|reason| hyper::ext::ReasonPhrase::try_from(reason.as_bytes()).ok());
    let base = buffer.as_ptr() as usize;
    spans.clear();
    spans.extend(response.headers.iter().map(|field| {
        let name = field.name.as_ptr() as usize - base;
        let value = field.value.as_ptr() as usize - base;
        (
            name,
            name + field.name.len(),
            value,
            value + field.value.len(),
        )
    }));
    let bytes: Bytes = buffer.split_to(length).freeze();
    // Room for the fields the gateway adds to a response (`via`, the request id, `date`) and two
    // to spare, so that the map is not grown on the way back.
    let mut headers = HeaderMap::with_capacity(spans.len() + 5);
    for &(name_start, name_end, value_start, value_end) in spans.iter() {
        let name = HeaderName::from_bytes(&bytes[name_start..name_end])
            .map_err(|_| H1Error::Malformed("a header name is invalid"))?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(value_start..value_end))
            .map_err(|_| H1Error::Malformed("a header value is invalid"))?;
        headers.append(name, value);
    }
    let keep_alive = keeps_alive(version, &headers);
    Ok(Parsed::Final(ResponseHead {
        status,
        version,
        reason,
        headers,
        keep_alive,
    }))
}

/// HTTP/1.1 keeps a connection open unless a `Connection` field says `close`; HTTP/1.0 closes it
/// unless one says `keep-alive` (and none says `close`).
fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    let mut close = false;
    let mut keep = false;
    for token in list_tokens(headers, &header::CONNECTION) {
        close |= token.eq_ignore_ascii_case(b"close");
        keep |= token.eq_ignore_ascii_case(b"keep-alive");
    }
    !close && (version == Version::HTTP_11 || keep)
}

/// The comma-separated tokens of every `name` field, trimmed.
fn list_tokens<'a>(
    headers: &'a HeaderMap,
    name: &header::HeaderName,
) -> impl Iterator<Item = &'a [u8]> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|value| value.as_bytes().split(|byte| *byte == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|token| !token.is_empty())
}

/// Whether the last transfer coding named is `chunked`.
pub fn last_coding_is_chunked(headers: &HeaderMap) -> bool {
    list_tokens(headers, &header::TRANSFER_ENCODING)
        .last()
        .is_some_and(|coding| coding.eq_ignore_ascii_case(b"chunked"))
}

/// The `Content-Length` of `headers`: none, one value (however often repeated, alone or in a
/// list), or an error for an element that is empty or not a number, or values that differ.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, ()> {
    let mut found: Option<u64> = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for element in value.as_bytes().split(|byte| *byte == b',') {
            let digits = element.trim_ascii();
            if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
                return Err(());
            }
            let number = std::str::from_utf8(digits)
                .ok()
                .and_then(|text| text.parse::<u64>().ok())
                .ok_or(())?;
            match found {
                Some(earlier) if earlier != number => return Err(()),
                _ => found = Some(number),
            }
        }
    }
    Ok(found)
}

/// Replaces a `Content-Length` given as a list or more than once (`5, 5`) by its one number, so
/// that the client reads the number alone.
pub fn normalize_content_length(headers: &mut HeaderMap) {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    let listed = match (values.next(), values.next()) {
        (Some(only), None) => only.as_bytes().contains(&b','),
        (Some(_), Some(_)) => true,
        (None, _) => false,
    };
    if listed {
        if let Ok(Some(length)) = content_length(headers) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        }
    }
}

/// What kind of head the start of a buffer holds, without taking it.
#[derive(Debug, PartialEq, Eq)]
pub enum Peeked {
    Partial,
    /// A whole 1xx head of this many bytes.
    Informational(usize),
    Final {
        /// An error status (4xx or 5xx).
        error: bool,
    },
}

/// Looks at the head at the start of `buffer` in place.
pub fn peek_head(buffer: &[u8]) -> Result<Peeked, H1Error> {
    let mut fields =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buffer,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(length)) => {
            let code = response.code.unwrap_or_default();
            Ok(if is_informational(code) {
                Peeked::Informational(length)
            } else {
                Peeked::Final { error: code >= 400 }
            })
        }
        Ok(httparse::Status::Partial) => Ok(Peeked::Partial),
        Err(_) => Err(H1Error::Malformed("the response head does not parse")),
    }
}

/// 1xx heads other than 101 are interim: the final head follows them.
fn is_informational(code: u16) -> bool {
    (100..200).contains(&code) && code != 101
}

/// How the body after `head` is delimited, for a request of `method` (RFC 9112 §6.3). A response
/// with both `Transfer-Encoding` and `Content-Length` is refused rather than forwarded: two readers
/// could frame it differently (§6.3 rule 3 calls it a likely smuggling attempt).
pub fn response_framing(head: &ResponseHead, method: &Method) -> Result<ResponseFraming, H1Error> {
    let status = head.status.as_u16();
    if status == 101 {
        return Err(H1Error::Malformed(
            "a switch of protocols the gateway did not ask for",
        ));
    }
    if status == 204 || status == 304 || *method == Method::HEAD {
        return Ok(ResponseFraming::Length(0));
    }
    if *method == Method::CONNECT && head.status.is_success() {
        return Err(H1Error::Malformed("a tunnel the gateway did not ask for"));
    }
    let headers = &head.headers;
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if head.version == Version::HTTP_10 {
            return Err(H1Error::Malformed(
                "Transfer-Encoding in an HTTP/1.0 response",
            ));
        }
        if headers.contains_key(header::CONTENT_LENGTH) {
            return Err(H1Error::Malformed(
                "both Transfer-Encoding and Content-Length",
            ));
        }
        return Ok(if last_coding_is_chunked(headers) {
            ResponseFraming::Chunked
        } else {
            ResponseFraming::UntilClose
        });
    }
    match content_length(headers) {
        Ok(Some(length)) => Ok(ResponseFraming::Length(length)),
        Ok(None) => Ok(ResponseFraming::UntilClose),
        Err(()) => Err(H1Error::Malformed("an invalid Content-Length")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn final_head(bytes: &[u8]) -> (ResponseHead, BytesMut) {
        let mut buffer = BytesMut::from(bytes);
        match parse_head(&mut buffer, &mut Vec::new()) {
            Ok(Parsed::Final(head)) => (head, buffer),
            Ok(_) => panic!("not a final head"),
            Err(e) => panic!("refused: {e}"),
        }
    }

    fn framing(bytes: &[u8], method: Method) -> Result<ResponseFraming, H1Error> {
        let (head, _) = final_head(bytes);
        response_framing(&head, &method)
    }

    #[test]
    fn a_head_is_taken_out_of_the_buffer_with_its_fields_and_the_rest_stays() {
        let (head, rest) =
            final_head(b"HTTP/1.1 201 Made\r\nContent-Length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\nok");
        assert_eq!(head.status, StatusCode::CREATED);
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(
            head.reason.as_ref().map(|r| r.as_bytes()),
            Some(&b"Made"[..])
        );
        assert_eq!(head.headers.get_all("x-a").iter().count(), 2);
        assert!(head.keep_alive);
        assert_eq!(&rest[..], b"ok");
    }

    #[test]
    fn informational_heads_are_skipped_and_partial_ones_wait() {
        let mut buffer = BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"[..]);
        assert!(matches!(
            parse_head(&mut buffer, &mut Vec::new()),
            Ok(Parsed::Informational(25))
        ));
        let mut partial = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Le"[..]);
        assert!(matches!(
            parse_head(&mut partial, &mut Vec::new()),
            Ok(Parsed::Partial)
        ));
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection() {
        assert!(
            !final_head(b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n\r\n")
                .0
                .keep_alive
        );
        assert!(!final_head(b"HTTP/1.0 200 OK\r\n\r\n").0.keep_alive);
        assert!(
            final_head(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\n\r\n")
                .0
                .keep_alive
        );
    }

    #[test]
    fn framing_follows_rfc_9112_and_refuses_what_could_be_read_two_ways() {
        let get = || Method::GET;
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", get()).ok(),
            Some(ResponseFraming::Length(5))
        );
        assert_eq!(
            framing(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\n",
                get()
            )
            .ok(),
            Some(ResponseFraming::Length(5))
        );
        assert_eq!(
            framing(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                Method::HEAD
            )
            .ok(),
            Some(ResponseFraming::Length(0))
        );
        assert_eq!(
            framing(
                b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
                get()
            )
            .ok(),
            Some(ResponseFraming::Length(0))
        );
        assert_eq!(
            framing(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                get()
            )
            .ok(),
            Some(ResponseFraming::Chunked)
        );
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", get()).ok(),
            Some(ResponseFraming::UntilClose)
        );
        assert_eq!(
            framing(b"HTTP/1.1 200 OK\r\n\r\n", get()).ok(),
            Some(ResponseFraming::UntilClose)
        );
        for refused in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        ] {
            assert!(
                framing(refused, get()).is_err(),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn malformed_heads_are_refused() {
        for refused in [
            &b"HTTP/1.1 200 OK\r\nBogus\r\n\r\n"[..],
            b"HTTP/2 200 OK\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
        ] {
            let mut buffer = BytesMut::from(refused);
            assert!(
                parse_head(&mut buffer, &mut Vec::new()).is_err(),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for n in 0..=MAX_RESPONSE_HEADERS {
            many.extend_from_slice(format!("X-{n}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(parse_head(&mut BytesMut::from(&many[..]), &mut Vec::new()).is_err());
    }

    #[test]
    fn content_length_lists_need_every_element_and_are_made_one_number() {
        let mut headers = HeaderMap::new();
        for refused in ["5,", ",5", "5,,5", " ", "5 5"] {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static(refused));
            assert_eq!(content_length(&headers), Err(()), "{refused}");
        }
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5, 5"));
        headers.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        assert_eq!(content_length(&headers), Ok(Some(5)));
        normalize_content_length(&mut headers);
        assert_eq!(headers.get_all(header::CONTENT_LENGTH).iter().count(), 1);
        assert_eq!(headers[header::CONTENT_LENGTH], "5");
    }

    #[test]
    fn a_peek_tells_interim_final_and_error_heads_apart_without_taking_them() {
        assert_eq!(
            peek_head(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 2").ok(),
            Some(Peeked::Informational(25))
        );
        assert_eq!(
            peek_head(b"HTTP/1.1 200 OK\r\n\r\n").ok(),
            Some(Peeked::Final { error: false })
        );
        assert_eq!(
            peek_head(b"HTTP/1.1 413 Too Large\r\n\r\n").ok(),
            Some(Peeked::Final { error: true })
        );
        assert_eq!(peek_head(b"HTTP/1.1 200 O").ok(), Some(Peeked::Partial));
    }
}
