//! What a request path may not contain before it is routed: dot segments, encoded separators and
//! backslashes, or captured segments that are empty, oversized or not UTF-8 — each a way to make
//! the gateway and the upstream disagree about which resource a path names.

use super::MAX_RESOURCE_KEY_LEN;

/// Why a path was refused (400 `invalid-path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathRefusal {
    #[error("the path contains a dot segment (`.` or `..`, encoded or not), which could reach another resource upstream")]
    DotSegment,
    #[error("the path contains an encoded slash or backslash (`%2F`, `%5C`) or a backslash, which an upstream may read as a separator")]
    EncodedSeparator,
    #[error("the path contains an encoded NUL byte (`%00`)")]
    EncodedNul,
    #[error("a path segment the route captures is empty")]
    EmptySegment,
    #[error("a path segment the route captures is longer than {MAX_CAPTURE_LEN} bytes")]
    SegmentTooLong,
    #[error("a path segment the route captures is not UTF-8 once percent-decoded")]
    NotUtf8,
}

/// Longest single captured segment (`{name}`): a longer one could never fit in a resource key.
pub const MAX_CAPTURE_LEN: usize = MAX_RESOURCE_KEY_LEN;

/// Checks a raw (still percent-encoded) path in one pass over its bytes, without allocating.
/// Upstreams normalise dot segments away (RFC 3986 §5.2.4) and some decode `%2F` or treat `\` as
/// `/`, so `/public/..%2Finvoices/7` could match an unfenced route here and write to a fenced
/// resource there; such paths are refused instead.
pub fn check_path(path: &str) -> Result<(), PathRefusal> {
    let bytes = path.as_bytes();
    // Per segment: how many `.` (raw or `%2E`) it holds, and whether it holds anything else.
    let mut dots = 0usize;
    let mut other = false;
    let mut i = 0;
    while i <= bytes.len() {
        let byte = bytes.get(i).copied();
        match byte {
            None | Some(b'/') => {
                if !other && (dots == 1 || dots == 2) {
                    return Err(PathRefusal::DotSegment);
                }
                dots = 0;
                other = false;
                i += 1;
            }
            Some(b'\\') => return Err(PathRefusal::EncodedSeparator),
            Some(b'.') => {
                dots += 1;
                i += 1;
            }
            Some(b'%') => {
                match percent_decoded(bytes, i) {
                    Some(b'/' | b'\\') => return Err(PathRefusal::EncodedSeparator),
                    Some(0) => return Err(PathRefusal::EncodedNul),
                    Some(b'.') => dots += 1,
                    _ => other = true,
                }
                i += 3;
            }
            Some(_) => {
                other = true;
                i += 1;
            }
        }
    }
    Ok(())
}

/// The byte `%XY` at `at` stands for, if it is a well-formed escape.
fn percent_decoded(bytes: &[u8], at: usize) -> Option<u8> {
    let hi = hex_value(*bytes.get(at + 1)?)?;
    let lo = hex_value(*bytes.get(at + 2)?)?;
    Some(hi << 4 | lo)
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{check_path, PathRefusal};

    #[test]
    fn dot_segments_are_found_encoded_or_not() {
        for path in [
            "/a/../b",
            "/a/./b",
            "/a/%2e%2E/b",
            "/a/.%2e/b",
            "/a/..",
            "/..",
            "/a/%2e",
        ] {
            assert_eq!(check_path(path), Err(PathRefusal::DotSegment), "{path}");
        }
        for path in [
            "/a/..b/c",
            "/a/.well-known",
            "/a/.../b",
            "/a/b.c",
            "/",
            "",
            "/a//b",
        ] {
            assert_eq!(check_path(path), Ok(()), "{path}");
        }
    }

    #[test]
    fn encoded_separators_and_backslashes_are_refused() {
        for path in ["/a/..%2Fb", "/a%2fb", "/a%5Cb", "/a%5c..", "/a\\b"] {
            assert_eq!(
                check_path(path),
                Err(PathRefusal::EncodedSeparator),
                "{path}"
            );
        }
        assert_eq!(check_path("/a%00b"), Err(PathRefusal::EncodedNul));
        // Other escapes, and malformed ones, are the matcher's business.
        assert_eq!(check_path("/a%20b/%zz/%4"), Ok(()));
    }
}
