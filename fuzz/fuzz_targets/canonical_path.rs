//! Fuzzes path canonicalisation against a simple reference model: a list of tokens (a raw byte,
//! or an escape and the byte it stands for), with the refusal rules stated over tokens. The
//! canonical path must be refused exactly when the model refuses, decode to the same bytes as the
//! model's (raw slashes merged), be its own canonical form, and spell only what canonical paths
//! may: pchar, '/', and upper-case escapes of bytes that are not unreserved.
#![no_main]

use fencegate::route::{canonicalize, PathRefusal};
use libfuzzer_sys::fuzz_target;

#[derive(Clone, Copy)]
struct Token {
    byte: u8,
    escaped: bool,
}

fn hex(byte: u8) -> Option<u8> {
    char::from(byte).to_digit(16).map(|d| d as u8)
}

fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._~".contains(&byte)
}

fn pchar(byte: u8) -> bool {
    unreserved(byte) || b"!$&'()*+,;=:@".contains(&byte)
}

/// The model: the decoded bytes of the canonical path, or the refusal. Refusals come in the
/// order the implementation makes them: the first byte, then the first bad escape, separator or
/// NUL from the left, then double escapes, then dot segments.
fn model(raw: &[u8]) -> Result<Vec<u8>, PathRefusal> {
    if raw.first() != Some(&b'/') {
        return Err(PathRefusal::NotAbsolute);
    }
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        let token = if raw[i] == b'%' {
            let (Some(hi), Some(lo)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(PathRefusal::MalformedEscape);
            };
            i += 3;
            Token {
                byte: hi << 4 | lo,
                escaped: true,
            }
        } else {
            i += 1;
            Token {
                byte: raw[i - 1],
                escaped: false,
            }
        };
        match (token.byte, token.escaped) {
            (b'\\', _) | (b'/', true) => return Err(PathRefusal::EncodedSeparator),
            (0, _) => return Err(PathRefusal::EncodedNul),
            _ => {}
        }
        tokens.push(token);
    }
    // An escaped '%' followed by two hex digits, raw or escaped (hex digits are unreserved, so
    // their escapes are decoded).
    for (at, token) in tokens.iter().enumerate() {
        let digit = |t: Option<&Token>| t.is_some_and(|t| hex(t.byte).is_some());
        if token.byte == b'%'
            && token.escaped
            && digit(tokens.get(at + 1))
            && digit(tokens.get(at + 2))
        {
            return Err(PathRefusal::DoubleEncoded);
        }
    }
    let mut decoded: Vec<Token> = Vec::new();
    for token in tokens {
        let slash = |t: &Token| t.byte == b'/' && !t.escaped;
        if slash(&token) && decoded.last().is_some_and(slash) {
            continue;
        }
        decoded.push(token);
    }
    // Segments between raw slashes; the name is what comes before a raw ';'.
    for segment in decoded.split(|t| t.byte == b'/' && !t.escaped) {
        let end = segment
            .iter()
            .position(|t| t.byte == b';' && !t.escaped)
            .unwrap_or(segment.len());
        let name: Vec<u8> = segment[..end].iter().map(|t| t.byte).collect();
        if name == b"." || name == b".." {
            return Err(PathRefusal::DotSegment);
        }
    }
    Ok(decoded.iter().map(|t| t.byte).collect())
}

fn decode(canonical: &str) -> Vec<u8> {
    let bytes = canonical.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = hex(bytes[i + 1]).expect("hex") << 4 | hex(bytes[i + 2]).expect("hex");
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let expected = model(raw.as_bytes());
    let got = canonicalize(raw);
    match (&got, &expected) {
        (Ok(path), Ok(bytes)) => {
            let text = path.as_str();
            assert_eq!(&decode(text), bytes, "{raw:?} -> {text:?}");
            assert!(!text.contains("//"), "{raw:?} -> {text:?}");
            let b = text.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' {
                    let byte = hex(b[i + 1]).expect("hex") << 4 | hex(b[i + 2]).expect("hex");
                    assert!(
                        !unreserved(byte),
                        "{raw:?} -> {text:?}: an unreserved escape"
                    );
                    assert!(
                        !b[i + 1..i + 3].iter().any(u8::is_ascii_lowercase),
                        "{text:?}"
                    );
                    i += 3;
                } else {
                    assert!(b[i] == b'/' || pchar(b[i]), "{raw:?} -> {text:?}");
                    i += 1;
                }
            }
            assert_eq!(
                canonicalize(text).as_ref(),
                Ok(path),
                "not idempotent: {text:?}"
            );
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "{raw:?}"),
        _ => panic!("{raw:?}: canonicalize says {got:?}, the model says {expected:?}"),
    }
});
