//! Whether a request's `Transfer-Encoding` is the one coding the gateway decodes: `chunked`, once.
//! hyper's server decodes the chunks of `gzip, chunked` (or `chunked, chunked`) and passes the
//! rest on as if it were the content, while the field, being hop-by-hop, is dropped: the upstream
//! would be sent bytes still coded as the client's content.

use http::header::{HeaderMap, TRANSFER_ENCODING};

/// True when the request names no transfer coding, or exactly one, `chunked` (in any letter case,
/// in one field line). Anything else (another coding, `chunked` twice, empty list elements, two
/// field lines) the gateway cannot pass on as the client framed it.
pub fn transfer_coding_is_plain(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(TRANSFER_ENCODING).iter();
    let Some(value) = values.next() else {
        return true;
    };
    values.next().is_none()
        && value
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with(values: &[&'static str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(TRANSFER_ENCODING, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn only_one_chunked_coding_is_plain() {
        assert!(transfer_coding_is_plain(&HeaderMap::new()));
        assert!(transfer_coding_is_plain(&with(&["chunked"])));
        assert!(transfer_coding_is_plain(&with(&["Chunked"])));
        assert!(transfer_coding_is_plain(&with(&[" chunked "])));
        for refused in [
            &["gzip, chunked"][..],
            &["chunked, chunked"],
            &["chunked,"],
            &[", chunked"],
            &["gzip"],
            &["gzip", "chunked"],
            &["chunked", "chunked"],
            &["chunked;q=1"],
        ] {
            assert!(!transfer_coding_is_plain(&with(refused)), "{refused:?}");
        }
    }
}
