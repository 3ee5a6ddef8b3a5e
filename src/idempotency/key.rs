//! Idempotency keys and request fingerprints. A derived key depends only on its template's inputs
//! (never on the fence, the holder or the time), so every attempt by any holder sends the same one.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::config::{KeyEncoding, KeyFormat};

/// The key sent upstream for a rendered template, written in `format`: the text itself (`raw`),
/// or a digest of it — HMAC-SHA256(secret, text) when the route has a secret (so keys reveal
/// nothing of the request), SHA-256(text) otherwise — in hex, base64url or UUID form, cut to
/// `max_length` characters (the route's compile step made sure that leaves at least 128 bits).
pub fn idempotency_key(
    rendered: &str,
    secret: Option<&[u8]>,
    format: KeyFormat,
    max_length: Option<usize>,
) -> String {
    if format == KeyFormat::Raw {
        return rendered.to_owned();
    }
    let digest: [u8; 32] = match secret.and_then(|s| Hmac::<Sha256>::new_from_slice(s).ok()) {
        Some(mut mac) => {
            mac.update(rendered.as_bytes());
            mac.finalize().into_bytes().into()
        }
        None => Sha256::digest(rendered.as_bytes()).into(),
    };
    let mut key = match format {
        KeyFormat::Raw | KeyFormat::Hex => hex(&digest),
        KeyFormat::Base64url => base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest),
        KeyFormat::Uuid => uuid_form(&digest),
    };
    if let Some(max) = max_length {
        // Every character of these forms is ASCII.
        key.truncate(max);
    }
    key
}

/// The key as its header carries it: itself, or as a Structured Fields string (RFC 8941 §3.3.3:
/// in double quotes, with `"` and `\` escaped by a backslash).
pub fn encode_key(key: &str, encoding: KeyEncoding) -> String {
    match encoding {
        KeyEncoding::Bare => key.to_owned(),
        KeyEncoding::SfString => {
            let mut quoted = String::with_capacity(key.len() + 2);
            quoted.push('"');
            for c in key.chars() {
                if matches!(c, '"' | '\\') {
                    quoted.push('\\');
                }
                quoted.push(c);
            }
            quoted.push('"');
            quoted
        }
    }
}

/// The key a client's header value carries: under `sf-string`, a well-formed Structured Fields
/// string is unquoted (so that the key is recorded, and sent, once quoted); anything else is the
/// key as it stands.
pub fn decode_client_key(value: &str, encoding: KeyEncoding) -> String {
    if encoding == KeyEncoding::SfString {
        if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            if let Some(key) = unescape_sf_string(inner) {
                return key;
            }
        }
    }
    value.to_owned()
}

/// The content of a Structured Fields string between its quotes: printable ASCII, with `"` and
/// `\` escaped; `None` when it is not one.
fn unescape_sf_string(inner: &str) -> Option<String> {
    let mut key = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => key.push(escaped),
                _ => return None,
            },
            '"' => return None,
            ' '..='~' => key.push(c),
            _ => return None,
        }
    }
    Some(key)
}

/// The first 128 bits of a digest written as a UUID with the version-4 and RFC 9562 variant bits
/// set, which providers that validate "a UUID v4" accept; the same input gives the same UUID.
fn uuid_form(digest: &[u8; 32]) -> String {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    uuid::Uuid::from_bytes(bytes).hyphenated().to_string()
}

/// SHA-256 over the method, the path with its query, and the body: what a repeat must match.
pub fn fingerprint(method: &str, path_and_query: &str, body: &[u8]) -> String {
    let mut digest = Sha256::new();
    for part in [method.as_bytes(), path_and_query.as_bytes()] {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    digest.update(Sha256::digest(body));
    hex(&digest.finalize())
}

/// Lowercase hex, two digits per byte, in one allocation.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_written_as_structured_fields_strings_on_request() {
        assert_eq!(encode_key("payout:7", KeyEncoding::Bare), "payout:7");
        assert_eq!(
            encode_key("payout:7", KeyEncoding::SfString),
            "\"payout:7\""
        );
        assert_eq!(
            encode_key("a\"b\\c", KeyEncoding::SfString),
            "\"a\\\"b\\\\c\""
        );
        for (sent, key) in [
            ("\"abc\"", "abc"),
            ("abc", "abc"),
            ("\"a\\\"b\"", "a\"b"),
            // Not a well-formed string: the key as it stands.
            ("\"a\\x\"", "\"a\\x\""),
            ("\"a\"b\"", "\"a\"b\""),
        ] {
            assert_eq!(
                decode_client_key(sent, KeyEncoding::SfString),
                key,
                "{sent}"
            );
            let again = encode_key(
                &decode_client_key(sent, KeyEncoding::SfString),
                KeyEncoding::SfString,
            );
            assert_eq!(
                decode_client_key(&again, KeyEncoding::SfString),
                key,
                "{sent}"
            );
        }
        assert_eq!(decode_client_key("\"abc\"", KeyEncoding::Bare), "\"abc\"");
    }

    #[test]
    fn hex_is_two_lowercase_digits_per_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff, 0x7b]), "000fa0ff7b");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn keys_are_stable_and_hmac_hides_the_input() {
        let key = |text, secret| idempotency_key(text, secret, KeyFormat::Hex, None);
        assert_eq!(
            idempotency_key("payout:7", None, KeyFormat::Raw, None),
            "payout:7"
        );
        let a = key("payout:7", Some(b"secret".as_slice()));
        assert_eq!(a, key("payout:7", Some(b"secret".as_slice())));
        assert_eq!(a.len(), 64);
        assert!(!a.contains("payout"));
        assert_ne!(a, key("payout:7", Some(b"other".as_slice())));
        // RFC 4231 test case 2.
        assert_eq!(
            key("what do ya want for nothing?", Some(b"Jefe".as_slice())),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // SHA-256 of "abc" (FIPS 180-2) without a secret.
        assert_eq!(
            key("abc", None),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn every_format_fits_what_providers_accept() {
        let secret = Some(b"Jefe".as_slice());
        let text = "what do ya want for nothing?";
        let b64 = idempotency_key(text, secret, KeyFormat::Base64url, None);
        assert_eq!(b64, "W9zBRr9gdU5qBCQmCJV1x1oAPwidJzmDnexYuWTsOEM");
        assert!(b64
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        // Amazon Pay: at most 32 of [A-Za-z0-9_-].
        let short = idempotency_key(text, secret, KeyFormat::Base64url, Some(32));
        assert_eq!(short, &b64[..32]);
        let uuid = idempotency_key(text, secret, KeyFormat::Uuid, None);
        assert_eq!(uuid, "5bdcc146-bf60-454e-aa04-2426089575c7");
        let parsed = uuid::Uuid::parse_str(&uuid).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(uuid, idempotency_key(text, secret, KeyFormat::Uuid, None));
        assert_ne!(uuid, idempotency_key(text, None, KeyFormat::Uuid, None));
        // Worldline: 40 characters.
        assert_eq!(
            idempotency_key(text, secret, KeyFormat::Hex, Some(40)),
            "5bdcc146bf60754e6a042426089575c75a003f08"
        );
    }

    #[test]
    fn fingerprints_tell_requests_apart() {
        let base = fingerprint("POST", "/payouts/7", b"{\"amount\":100}");
        assert_eq!(base, fingerprint("POST", "/payouts/7", b"{\"amount\":100}"));
        assert_ne!(base, fingerprint("POST", "/payouts/7", b"{\"amount\":101}"));
        assert_ne!(base, fingerprint("PUT", "/payouts/7", b"{\"amount\":100}"));
        assert_ne!(
            base,
            fingerprint("POST", "/payouts/7?x", b"{\"amount\":100}")
        );
        assert_ne!(
            fingerprint("POST", "/a", b"b"),
            fingerprint("POS", "T/a", b"b")
        );
    }
}
