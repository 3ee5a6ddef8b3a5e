//! Parsing the fencing token: one header field holding a plain decimal u64, nothing else.

use http::{HeaderMap, HeaderName};

/// Why a request carries no usable token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the request has no fencing token header")]
    Missing,
    #[error("the fencing token header appears more than once")]
    Repeated,
    #[error("the fencing token is empty")]
    Empty,
    #[error("the fencing token is not a plain decimal number")]
    NotDecimal,
    #[error("the fencing token is larger than 18446744073709551615")]
    Overflow,
}

/// Reads the one `name` field of `headers` as a token. Two fields are refused even when equal: a
/// proxy or client that duplicated the header cannot be trusted to have sent the right one.
pub fn read_fence_header(headers: &HeaderMap, name: &HeaderName) -> Result<u64, TokenError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(TokenError::Missing)?;
    if values.next().is_some() {
        return Err(TokenError::Repeated);
    }
    parse_fence_token(value.as_bytes())
}

/// Parses a field value as a token. Leading and trailing whitespace is not part of a field value
/// (RFC 9110 §5.5) and is ignored; anything else that is not an ASCII digit — a sign, an inner
/// space, a comma joining two values — is refused, as is a value above `u64::MAX`.
///
/// ```
/// use fencegate::token::{parse_fence_token, TokenError};
///
/// assert_eq!(parse_fence_token(b"34"), Ok(34));
/// assert_eq!(parse_fence_token(b"+34"), Err(TokenError::NotDecimal));
/// assert_eq!(parse_fence_token(b"18446744073709551616"), Err(TokenError::Overflow));
/// ```
pub fn parse_fence_token(value: &[u8]) -> Result<u64, TokenError> {
    let value = value.trim_ascii();
    if value.is_empty() {
        return Err(TokenError::Empty);
    }
    // Classify before computing: a long run of digits followed by junk is not a number at all,
    // and must not be reported as one too large (found by the `fence_token` fuzz target).
    if !value.iter().all(u8::is_ascii_digit) {
        return Err(TokenError::NotDecimal);
    }
    let mut token: u64 = 0;
    for &byte in value {
        token = token
            .checked_mul(10)
            .and_then(|t| t.checked_add(u64::from(byte - b'0')))
            .ok_or(TokenError::Overflow)?;
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_decimals_parse() {
        assert_eq!(parse_fence_token(b"0"), Ok(0));
        assert_eq!(parse_fence_token(b"42"), Ok(42));
        assert_eq!(parse_fence_token(b" 42\t"), Ok(42));
        assert_eq!(parse_fence_token(b"18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn everything_else_is_refused() {
        assert_eq!(parse_fence_token(b""), Err(TokenError::Empty));
        assert_eq!(parse_fence_token(b"   "), Err(TokenError::Empty));
        assert_eq!(parse_fence_token(b"+1"), Err(TokenError::NotDecimal));
        assert_eq!(parse_fence_token(b"-1"), Err(TokenError::NotDecimal));
        assert_eq!(parse_fence_token(b"4 2"), Err(TokenError::NotDecimal));
        assert_eq!(parse_fence_token(b"1,2"), Err(TokenError::NotDecimal));
        assert_eq!(parse_fence_token(b"0x10"), Err(TokenError::NotDecimal));
        assert_eq!(parse_fence_token(b"1e3"), Err(TokenError::NotDecimal));
        assert_eq!(
            parse_fence_token(b"18446744073709551616"),
            Err(TokenError::Overflow)
        );
        assert_eq!(
            parse_fence_token(b"99999999999999999999999"),
            Err(TokenError::Overflow)
        );
        assert_eq!(
            parse_fence_token(b"99999999999999999999999x"),
            Err(TokenError::NotDecimal)
        );
    }

    #[test]
    fn header_must_appear_exactly_once() {
        let name = HeaderName::from_static("x-fence");
        let mut headers = HeaderMap::new();
        assert_eq!(read_fence_header(&headers, &name), Err(TokenError::Missing));
        headers.append(&name, "5".parse().unwrap());
        assert_eq!(read_fence_header(&headers, &name), Ok(5));
        headers.append(&name, "5".parse().unwrap());
        assert_eq!(
            read_fence_header(&headers, &name),
            Err(TokenError::Repeated)
        );
    }
}
