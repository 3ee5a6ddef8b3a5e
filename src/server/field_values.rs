//! hyper's server reads of single field values, shared by the HTTP/1 head reader and writer: a
//! token in a comma-separated list, the last transfer coding, a `Content-Length`'s digits.

use http::header::HeaderValue;

/// Whether the comma-separated list `value` has `token`, in any letter case.
pub(super) fn has_token(value: &HeaderValue, token: &str) -> bool {
    value.to_str().is_ok_and(|list| {
        list.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    })
}

/// Whether the last coding `value` names is `chunked`.
pub(super) fn last_coding_is_chunked(value: &HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|codings| codings.rsplit(',').next())
        .is_some_and(|coding| coding.trim().eq_ignore_ascii_case("chunked"))
}

/// A `Content-Length` value: decimal digits only, within a `u64`.
pub(super) fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |value, &byte| {
        if !byte.is_ascii_digit() {
            return None;
        }
        value.checked_mul(10)?.checked_add(u64::from(byte - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_hyper_reads_them() {
        let value = HeaderValue::from_static("keep-alive, Close");
        assert!(has_token(&value, "close") && has_token(&value, "Keep-Alive"));
        assert!(!has_token(&value, "clos"));
        assert!(last_coding_is_chunked(&HeaderValue::from_static(
            "gzip, Chunked "
        )));
        assert!(!last_coding_is_chunked(&HeaderValue::from_static(
            "chunked, gzip"
        )));
        assert_eq!(digits(b"0042"), Some(42));
        assert_eq!(digits(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"+1", b"1 ", b"18446744073709551616", b"1,1"] {
            assert_eq!(digits(bad), None, "{bad:?}");
        }
    }
}
