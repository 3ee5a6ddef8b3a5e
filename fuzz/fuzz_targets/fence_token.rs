//! Fuzzes the fencing-token parser: `parse_fence_token` on arbitrary bytes and `read_fence_header`
//! on one or two header fields, checking each verdict against an independent reading of the input.
#![no_main]

use fencegate::fence::{parse_fence_token, read_fence_header, TokenError};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let verdict = parse_fence_token(data);
    assert_eq!(verdict, expected(data), "input {data:?}");
    if let Ok(token) = verdict {
        // Re-printed, an accepted token parses to itself.
        assert_eq!(parse_fence_token(token.to_string().as_bytes()), Ok(token));
    }
    check_header(data, verdict);
});

/// The verdict computed another way: trim, classify, and compare digit strings by length.
fn expected(data: &[u8]) -> Result<u64, TokenError> {
    let trimmed = data.trim_ascii();
    if trimmed.is_empty() {
        return Err(TokenError::Empty);
    }
    if !trimmed.iter().all(u8::is_ascii_digit) {
        return Err(TokenError::NotDecimal);
    }
    let significant = match trimmed.iter().position(|&b| b != b'0') {
        Some(first) => &trimmed[first..],
        None => return Ok(0),
    };
    let max = u64::MAX.to_string();
    if significant.len() > max.len()
        || (significant.len() == max.len() && significant > max.as_bytes())
    {
        return Err(TokenError::Overflow);
    }
    let mut value = 0u64;
    for &digit in significant {
        value = value * 10 + u64::from(digit - b'0');
    }
    Ok(value)
}

/// The header reader agrees with the parser for one field, and refuses two.
fn check_header(data: &[u8], verdict: Result<u64, TokenError>) {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let name = HeaderName::from_static("x-fence");
    let mut headers = HeaderMap::new();
    assert_eq!(read_fence_header(&headers, &name), Err(TokenError::Missing));
    headers.append(&name, value.clone());
    assert_eq!(read_fence_header(&headers, &name), verdict);
    headers.append(&name, value);
    assert_eq!(
        read_fence_header(&headers, &name),
        Err(TokenError::Repeated)
    );
}
