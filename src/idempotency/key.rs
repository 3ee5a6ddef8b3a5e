//! Idempotency keys and request fingerprints. A derived key depends only on its template's inputs
//! (never on the fence, the holder or the time), so every attempt by any holder sends the same one.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The key sent upstream for a rendered template: the text itself, or HMAC-SHA256(secret, text)
/// in hex when the route configures a secret (so keys reveal nothing of the request).
pub fn idempotency_key(rendered: &str, secret: Option<&[u8]>) -> String {
    match secret.and_then(|s| Hmac::<Sha256>::new_from_slice(s).ok()) {
        None => rendered.to_owned(),
        Some(mut mac) => {
            mac.update(rendered.as_bytes());
            hex(&mac.finalize().into_bytes())
        }
    }
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_hmac_hides_the_input() {
        assert_eq!(idempotency_key("payout:7", None), "payout:7");
        let a = idempotency_key("payout:7", Some(b"secret"));
        assert_eq!(a, idempotency_key("payout:7", Some(b"secret")));
        assert_eq!(a.len(), 64);
        assert!(!a.contains("payout"));
        assert_ne!(a, idempotency_key("payout:7", Some(b"other")));
        // RFC 4231 test case 2.
        assert_eq!(
            idempotency_key("what do ya want for nothing?", Some(b"Jefe")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
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
