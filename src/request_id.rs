//! `X-Request-Id`: kept from the client when sane, generated otherwise, forwarded upstream,
//! returned on every response and carried by every refusal's log line.
//!
//! [`assign_request_id`] runs first in `Gateway::call`, before the reserved endpoints and the
//! routed stack split, so both see the same id; [`stamp_request_id`] runs last, on whatever
//! response came out (upstream, replay or problem).

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};

/// The request id header, as sent by the client, forwarded upstream and returned.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client-supplied id kept: enough for any UUID, ULID or trace id, short enough that
/// a client cannot make every log line it causes arbitrarily large.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// The id of one request, always visible ASCII of at most [`MAX_REQUEST_ID_LEN`] bytes. The
/// layers read it from the request's `X-Request-Id`, which [`assign_request_id`] sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// A fresh random id (UUID v4, hyphenated).
    pub fn generate() -> RequestId {
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
        // A hyphenated UUID is 36 visible ASCII bytes: always a valid header value, so the nil
        // UUID fallback is never used. The array itself becomes the value's shared bytes: one
        // allocation, which the clones for the upstream's request and the client's answer share.
        RequestId(
            HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(text)).unwrap_or(
                HeaderValue::from_static("00000000-0000-0000-0000-000000000000"),
            ),
        )
    }

    /// The client's id if there is exactly one `X-Request-Id` field and it is sane.
    pub fn from_client(headers: &HeaderMap) -> Option<RequestId> {
        let mut values = headers.get_all(&X_REQUEST_ID).iter();
        let value = values.next()?;
        if values.next().is_some() || !is_sane_request_id(value.as_bytes()) {
            return None;
        }
        Some(RequestId(value.clone()))
    }

    pub fn as_str(&self) -> &str {
        // Construction admits visible ASCII only, so this never falls back.
        self.0.to_str().unwrap_or_default()
    }

    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A client-supplied id is kept when it is 1 to [`MAX_REQUEST_ID_LEN`] bytes of visible ASCII
/// (`VCHAR`, RFC 5234 Appendix B.1: `%x21-7E`) — no spaces, controls or obs-text that could
/// corrupt a log line or a downstream header.
pub fn is_sane_request_id(value: &[u8]) -> bool {
    !value.is_empty()
        && value.len() <= MAX_REQUEST_ID_LEN
        && value.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// Decides the request's id (the client's when sane, a new UUID otherwise), writes it to the
/// request's `X-Request-Id` (replacing any other value, so the upstream sees exactly this id),
/// and returns it.
pub fn assign_request_id<B>(request: &mut Request<B>) -> RequestId {
    let id = RequestId::from_client(request.headers()).unwrap_or_else(RequestId::generate);
    request
        .headers_mut()
        .insert(X_REQUEST_ID, id.header_value().clone());
    id
}

/// Sets the response's `X-Request-Id` to the request's id, replacing whatever the upstream sent.
pub fn stamp_request_id<B>(mut response: Response<B>, id: &RequestId) -> Response<B> {
    response
        .headers_mut()
        .insert(X_REQUEST_ID, id.header_value().clone());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with(values: &[&[u8]]) -> Request<()> {
        let mut request = Request::new(());
        for value in values {
            let value = HeaderValue::from_bytes(value).expect("test header value");
            request.headers_mut().append(X_REQUEST_ID, value);
        }
        request
    }

    #[test]
    fn sane_client_id_is_kept() {
        let mut request = request_with(&[b"abc-123_XYZ.{}"]);
        let id = assign_request_id(&mut request);
        assert_eq!(id.as_str(), "abc-123_XYZ.{}");
        assert_eq!(request.headers()[X_REQUEST_ID], "abc-123_XYZ.{}");
    }

    #[test]
    fn id_of_exactly_the_limit_is_kept_and_one_more_byte_is_not() {
        let longest = "a".repeat(MAX_REQUEST_ID_LEN);
        assert!(is_sane_request_id(longest.as_bytes()));
        let too_long = "a".repeat(MAX_REQUEST_ID_LEN + 1);
        assert!(!is_sane_request_id(too_long.as_bytes()));
    }

    #[test]
    fn spaces_controls_and_non_ascii_are_not_sane() {
        for bad in [&b""[..], b"a b", b"a\tb", b"\x7f", b"caf\xc3\xa9", b"\x01x"] {
            assert!(!is_sane_request_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn missing_insane_or_repeated_ids_are_replaced_by_a_uuid() {
        for values in [&[][..], &[&b"a b"[..]], &[&b"one"[..], &b"two"[..]]] {
            let mut request = request_with(values);
            let id = assign_request_id(&mut request);
            assert!(uuid::Uuid::parse_str(id.as_str()).is_ok(), "{values:?}");
            let sent: Vec<_> = request.headers().get_all(X_REQUEST_ID).iter().collect();
            assert_eq!(sent, [id.header_value()]);
        }
    }

    #[test]
    fn stamping_replaces_the_upstreams_id() {
        let mut response = Response::new(());
        response
            .headers_mut()
            .insert(X_REQUEST_ID, HeaderValue::from_static("upstream"));
        let id = RequestId::generate();
        let response = stamp_request_id(response, &id);
        assert_eq!(response.headers()[X_REQUEST_ID], id.as_str());
    }
}
