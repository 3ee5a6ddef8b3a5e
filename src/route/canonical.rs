//! The one canonical form of a request path, made before routing: the form that is matched, keyed
//! and forwarded, so the gateway and the upstream read the same resource from it. What cannot be
//! made canonical (dot segments, encoded separators, malformed or double escapes) is refused.

use super::MAX_RESOURCE_KEY_LEN;

/// Why a path was refused (400 `invalid-path`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefusal {
    #[error("the path does not start with '/'")]
    NotAbsolute,
    #[error("the path contains a dot segment (`.` or `..`, encoded, or followed by `;` parameters), which could reach another resource upstream")]
    DotSegment,
    #[error("the path contains an encoded slash or backslash (`%2F`, `%5C`) or a backslash, which an upstream may read as a separator")]
    EncodedSeparator,
    #[error("the path contains a NUL byte (raw or `%00`)")]
    EncodedNul,
    #[error("the path contains a `%` that is not followed by two hex digits")]
    MalformedEscape,
    #[error("the path contains a double-encoded escape (`%25` followed by two hex digits), which an upstream that decodes twice would read differently")]
    DoubleEncoded,
    #[error("the path has `;` parameters on a fenced route, which some upstreams strip before routing (set the route's path_parameters = \"strip\" to remove them)")]
    PathParameters,
    #[error("the path's last segment has a `.suffix` that Rails and older Spring read as a format of the path without it, another resource here (set the route's format_suffix = \"literal\" when the upstream keeps suffixes)")]
    FormatSuffix,
    #[error("the path names the gateway's reserved prefix in a non-canonical form")]
    ReservedPrefix,
    #[error("a path segment the route captures is longer than {MAX_CAPTURE_LEN} bytes")]
    SegmentTooLong,
    #[error("a path segment the route captures is not UTF-8 once percent-decoded")]
    NotUtf8,
    #[error("path segment {{{name}}} {refusal}")]
    NotOfType {
        name: String,
        refusal: crate::input_type::ValueRefusal,
    },
}

/// Longest single captured segment (`{name}`): a longer one could never fit in a resource key.
pub const MAX_CAPTURE_LEN: usize = MAX_RESOURCE_KEY_LEN;

/// A request path in canonical form (RFC 3986 §6.2.2 plus the rules upstreams share): escapes of
/// unreserved characters decoded, other escapes upper-case, characters outside `pchar` encoded,
/// repeated slashes merged, no dot segments. A trailing slash is kept (it is forwarded) but
/// ignored when matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPath {
    text: String,
}

impl CanonicalPath {
    /// The canonical text, starting with '/'.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether a segment has `;` parameters (a raw `;`; `%3B` is data).
    pub fn has_parameters(&self) -> bool {
        self.text.contains(';')
    }

    /// Whether the path ends in a slash after a segment (`/a/`, not `/`).
    pub fn has_trailing_slash(&self) -> bool {
        self.text.len() > 1 && self.text.ends_with('/')
    }

    /// The segments a pattern is matched against: the text between slashes, the trailing slash
    /// ignored. The root is one empty segment.
    pub fn segments(&self) -> impl Iterator<Item = &str> + Clone {
        let body = &self.text[1..];
        body.strip_suffix('/').unwrap_or(body).split('/')
    }

    /// This path with every segment's `;` parameters removed, as Tomcat and Spring read it.
    pub fn without_parameters(&self) -> CanonicalPath {
        let mut text = String::with_capacity(self.text.len());
        for (i, segment) in self.text.split('/').enumerate() {
            if i > 0 {
                text.push('/');
            }
            text.push_str(segment.split_once(';').map_or(segment, |(keep, _)| keep));
        }
        merge_slashes(&mut text);
        CanonicalPath { text }
    }
}

/// Makes `raw` (a request target's path, still percent-encoded) canonical, or says why it cannot
/// be. One pass over the bytes, then a check of every segment.
pub fn canonicalize(raw: &str) -> Result<CanonicalPath, PathRefusal> {
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathRefusal::NotAbsolute);
    }
    if is_canonical_already(bytes) {
        // The common case: nothing to decode, escape or merge; only dot segments to look for.
        for segment in raw[1..].split('/') {
            check_segment(segment.as_bytes())?;
        }
        return Ok(CanonicalPath {
            text: raw.to_owned(),
        });
    }
    let mut text = String::with_capacity(raw.len());
    // Where the segment being built starts in `text`, and whether a `%25` was written.
    let mut segment_start = 1;
    let mut escaped_percent = false;
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b'%' => {
                let decoded = percent_decoded(bytes, i).ok_or(PathRefusal::MalformedEscape)?;
                match decoded {
                    b'/' | b'\\' => return Err(PathRefusal::EncodedSeparator),
                    0 => return Err(PathRefusal::EncodedNul),
                    _ if is_unreserved(decoded) => text.push(char::from(decoded)),
                    _ => {
                        escaped_percent |= decoded == b'%';
                        push_escaped(&mut text, decoded);
                    }
                }
                i += 3;
            }
            b'\\' => return Err(PathRefusal::EncodedSeparator),
            0 => return Err(PathRefusal::EncodedNul),
            b'/' => {
                if !text.ends_with('/') {
                    check_segment(&text.as_bytes()[segment_start.min(text.len())..])?;
                    text.push('/');
                    segment_start = text.len();
                }
                i += 1;
            }
            _ if is_pchar(byte) => {
                text.push(char::from(byte));
                i += 1;
            }
            _ => {
                push_escaped(&mut text, byte);
                i += 1;
            }
        }
    }
    check_segment(&text.as_bytes()[segment_start.min(text.len())..])?;
    // Checked on the result, so that `%25%32%65` (which becomes `%252e`) is caught too.
    if escaped_percent
        && text
            .match_indices("%25")
            .any(|(at, _)| is_hex_pair(text.as_bytes(), at + 3))
    {
        return Err(PathRefusal::DoubleEncoded);
    }
    Ok(CanonicalPath { text })
}

/// Whether a path has nothing to decode, escape or merge: only `pchar` and single slashes.
fn is_canonical_already(bytes: &[u8]) -> bool {
    let mut previous_slash = false;
    bytes.iter().all(|&byte| {
        let slash = byte == b'/';
        let ok = if slash {
            !previous_slash
        } else {
            is_pchar(byte)
        };
        previous_slash = slash;
        ok
    })
}

/// Refuses a dot segment: `.` or `..`, also before `;` parameters (`..;x` is `..` to an upstream
/// that strips path parameters first).
fn check_segment(segment: &[u8]) -> Result<(), PathRefusal> {
    let name = match segment.iter().position(|&b| b == b';') {
        Some(end) => &segment[..end],
        None => segment,
    };
    if name == b"." || name == b".." {
        return Err(PathRefusal::DotSegment);
    }
    Ok(())
}

/// Makes one literal segment of a route pattern canonical, as a request path would be; `None` when
/// it could never match a canonical request (it holds something a request path is refused for).
pub fn canonical_literal(segment: &str) -> Option<String> {
    if segment.contains(['/', ';']) {
        return None;
    }
    let path = canonicalize(&format!("/{segment}")).ok()?;
    Some(path.text[1..].to_owned())
}

fn merge_slashes(text: &mut String) {
    let mut previous_slash = false;
    text.retain(|c| {
        let keep = !(c == '/' && previous_slash);
        previous_slash = c == '/';
        keep
    });
}

/// RFC 3986 §2.3.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// RFC 3986 §3.3 `pchar` less `pct-encoded`: unreserved, sub-delims, ':' and '@'.
fn is_pchar(byte: u8) -> bool {
    is_unreserved(byte)
        || matches!(
            byte,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

fn push_escaped(text: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    text.push('%');
    text.push(char::from(HEX[usize::from(byte >> 4)]));
    text.push(char::from(HEX[usize::from(byte & 0xF)]));
}

/// The byte `%XY` at `at` stands for, if it is a well-formed escape.
fn percent_decoded(bytes: &[u8], at: usize) -> Option<u8> {
    if bytes.get(at) != Some(&b'%') {
        return None;
    }
    let hi = hex_value(*bytes.get(at + 1)?)?;
    let lo = hex_value(*bytes.get(at + 2)?)?;
    Some(hi << 4 | lo)
}

fn is_hex_pair(bytes: &[u8], at: usize) -> bool {
    let hex = |i: usize| bytes.get(i).copied().and_then(hex_value).is_some();
    hex(at) && hex(at + 1)
}

fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::{canonical_literal, canonicalize, PathRefusal};

    #[test]
    fn canonical_forms() {
        for (raw, canonical) in [
            ("/", "/"),
            ("//", "/"),
            ("/invoices/1", "/invoices/1"),
            ("//invoices/1", "/invoices/1"),
            ("/invoices//1", "/invoices/1"),
            ("///invoices///1//", "/invoices/1/"),
            ("/invoices/1/", "/invoices/1/"),
            ("/%69nvoices/1", "/invoices/1"),
            ("/invoice%73/%31", "/invoices/1"),
            ("/a%7e%2D%2e%5fb", "/a~-._b"),
            ("/a%20b", "/a%20b"),
            ("/a%3bb", "/a%3Bb"),
            ("/a%c3%a9", "/a%C3%A9"),
            ("/a%25", "/a%25"),
            ("/a%25z1", "/a%25z1"),
            ("/a\"b", "/a%22b"),
            ("/a{b}|^`<>", "/a%7Bb%7D%7C%5E%60%3C%3E"),
            ("/a;x=y/b", "/a;x=y/b"),
            ("/a:b@c!$&'()*+,=", "/a:b@c!$&'()*+,="),
            ("/a/..b/.well-known/...", "/a/..b/.well-known/..."),
            ("/Invoices/1", "/Invoices/1"),
        ] {
            assert_eq!(
                canonicalize(raw).map(|p| p.as_str().to_owned()),
                Ok(canonical.to_owned()),
                "{raw}"
            );
        }
    }

    #[test]
    fn what_cannot_be_canonical_is_refused() {
        for (raw, why) in [
            ("", PathRefusal::NotAbsolute),
            ("*", PathRefusal::NotAbsolute),
            ("invoices/1", PathRefusal::NotAbsolute),
            ("/a/../b", PathRefusal::DotSegment),
            ("/a/./b", PathRefusal::DotSegment),
            ("/a/%2e%2E/b", PathRefusal::DotSegment),
            ("/a/.%2e/b", PathRefusal::DotSegment),
            ("/a/..", PathRefusal::DotSegment),
            ("/..", PathRefusal::DotSegment),
            ("/a/%2e", PathRefusal::DotSegment),
            ("/public/..;/invoices/1", PathRefusal::DotSegment),
            ("/public/.;x=1/invoices/1", PathRefusal::DotSegment),
            ("/a/..%2Fb", PathRefusal::EncodedSeparator),
            ("/a%2fb", PathRefusal::EncodedSeparator),
            ("/%2Finvoices/1", PathRefusal::EncodedSeparator),
            ("/a%5Cb", PathRefusal::EncodedSeparator),
            ("/a\\b", PathRefusal::EncodedSeparator),
            ("/a%00b", PathRefusal::EncodedNul),
            ("/a%zz", PathRefusal::MalformedEscape),
            ("/a%4", PathRefusal::MalformedEscape),
            ("/a%", PathRefusal::MalformedEscape),
            ("/invoices/%2531", PathRefusal::DoubleEncoded),
            ("/%252e%252e/x", PathRefusal::DoubleEncoded),
            ("/public/%25%32%65%25%32%65/x", PathRefusal::DoubleEncoded),
            ("/a\0b", PathRefusal::EncodedNul),
        ] {
            assert_eq!(canonicalize(raw), Err(why), "{raw}");
        }
    }

    #[test]
    fn canonical_is_idempotent() {
        for raw in [
            "//a/%7e/b%20c/",
            "/a;b=c//d",
            "/%C3%A9t%c3%a9/",
            "/a\u{1}\u{7f}%25",
        ] {
            let once = canonicalize(raw).unwrap();
            assert_eq!(canonicalize(once.as_str()).unwrap(), once, "{raw}");
        }
    }

    #[test]
    fn segments_ignore_the_trailing_slash() {
        let path = canonicalize("/a/b/").unwrap();
        assert!(path.has_trailing_slash());
        assert_eq!(path.segments().collect::<Vec<_>>(), ["a", "b"]);
        let root = canonicalize("/").unwrap();
        assert!(!root.has_trailing_slash());
        assert_eq!(root.segments().collect::<Vec<_>>(), [""]);
    }

    #[test]
    fn parameters_are_stripped_per_segment() {
        let path = canonicalize("/invoices;x/1;a=b;c/").unwrap();
        assert!(path.has_parameters());
        assert_eq!(path.without_parameters().as_str(), "/invoices/1/");
        let emptied = canonicalize("/invoices/;x").unwrap();
        assert_eq!(emptied.without_parameters().as_str(), "/invoices/");
        assert!(!canonicalize("/a%3Bb").unwrap().has_parameters());
    }

    #[test]
    fn pattern_literals_are_made_canonical_too() {
        assert_eq!(canonical_literal("%69nvoices").as_deref(), Some("invoices"));
        assert_eq!(canonical_literal("caf\u{e9}").as_deref(), Some("caf%C3%A9"));
        assert_eq!(canonical_literal("a;b"), None);
        assert_eq!(canonical_literal(".."), None);
    }
}
