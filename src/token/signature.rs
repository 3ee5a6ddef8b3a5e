//! Signed fencing tokens: the lock authority signs the resource key and the token with a shared
//! secret (HMAC-SHA256), so a client that can reach the data plane cannot mint a token of its own.
//!
//! The signed message is the key's UTF-8 bytes, one `\n`, then the token in plain decimal
//! (`invoice:72\n34`). The token never contains `\n`, so the last `\n` splits the message
//! unambiguously whatever the key holds. The signature is the MAC in hexadecimal, 64 digits
//! (produced lower-case; either case is accepted). It binds key and token, not the request body.

use std::fmt;

use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName};
use sha2::Sha256;

/// Length of an HMAC-SHA256 in bytes.
const MAC_LEN: usize = 32;

/// Why a request's token signature is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the request has no fencing token signature")]
    Missing,
    #[error("the fencing token signature header appears more than once")]
    Repeated,
    #[error("the fencing token signature is not 64 hexadecimal digits")]
    Malformed,
    #[error("the fencing token signature does not match the key and token")]
    Mismatch,
}

/// A route's signing secret and the header its signatures come in.
#[derive(Clone)]
pub struct SignatureKey {
    header: HeaderName,
    mac: Hmac<Sha256>,
}

/// The secret stays out of logs and `Debug` output.
impl fmt::Debug for SignatureKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignatureKey")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl SignatureKey {
    /// A key for `secret`, whose signatures arrive in `header`; `None` only if the HMAC
    /// implementation refused the secret (it takes any length). Callers refuse empty secrets.
    pub fn new(header: HeaderName, secret: &[u8]) -> Option<SignatureKey> {
        let mac = Hmac::<Sha256>::new_from_slice(secret).ok()?;
        Some(SignatureKey { header, mac })
    }

    /// The header carrying signatures.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// Checks the one signature field of `headers` against `key` and `token`, in constant time.
    pub fn verify(&self, headers: &HeaderMap, key: &str, token: u64) -> Result<(), SignatureError> {
        let mut values = headers.get_all(&self.header).iter();
        let value = values.next().ok_or(SignatureError::Missing)?;
        if values.next().is_some() {
            return Err(SignatureError::Repeated);
        }
        let signature =
            decode_hex(value.as_bytes().trim_ascii()).ok_or(SignatureError::Malformed)?;
        let mut mac = self.mac.clone();
        mac.update(&signed_message(key, token));
        mac.verify_slice(&signature)
            .map_err(|_| SignatureError::Mismatch)
    }
}

/// The bytes a lock authority signs for `key` and `token`: `key`, `\n`, decimal `token`.
pub fn signed_message(key: &str, token: u64) -> Vec<u8> {
    format!("{key}\n{token}").into_bytes()
}

/// The signature a lock authority attaches: lower-case hex HMAC-SHA256(secret, key\ntoken), the
/// same as `printf 'invoice:72\n34' | openssl dgst -sha256 -hmac secret`.
///
/// ```
/// use fencegate::token::sign_token;
///
/// assert_eq!(
///     sign_token(b"secret", "invoice:72", 34).as_deref(),
///     Some("f26fb0c3e8cadcfd36934bf376c21e2522b9436bc4a3dfd9a9f0dd2f0c7ebac9"),
/// );
/// ```
pub fn sign_token(secret: &[u8], key: &str, token: u64) -> Option<String> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).ok()?;
    mac.update(&signed_message(key, token));
    Some(
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// Why a route's signing secret could not be set up; `field` is relative to the route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureConfigError {
    pub field: &'static str,
    pub message: String,
}

/// The route's signing key, if it names a secret: read from the environment variable
/// `secret_env` or the file `secret_file`, signatures in the header `header`. A missing or empty
/// secret is an error, so the gateway refuses to start rather than accept unsigned tokens on a
/// route meant to require them.
pub fn signature_key_from(
    header: &str,
    secret_env: Option<&str>,
    secret_file: Option<&std::path::Path>,
) -> Result<Option<SignatureKey>, SignatureConfigError> {
    let error = |field: &'static str, message: String| SignatureConfigError { field, message };
    let field = if secret_file.is_some() {
        "fence.signature_secret_file"
    } else {
        "fence.signature_secret_env"
    };
    if secret_env.is_some_and(str::is_empty) {
        return Err(error(field, "must name an environment variable".to_owned()));
    }
    let Some(secret) = crate::config::secret::read("signature_secret", secret_env, secret_file)
        .map_err(|e| error(field, e.to_string()))?
    else {
        return Ok(None);
    };
    let header = HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
        error(
            "fence.signature_header",
            "not a valid header name".to_owned(),
        )
    })?;
    SignatureKey::new(header, secret.as_bytes())
        .map(Some)
        .ok_or_else(|| error(field, "the secret cannot key HMAC-SHA256".to_owned()))
}

/// 64 hex digits (either case) → 32 bytes; anything else → `None`.
fn decode_hex(text: &[u8]) -> Option<[u8; MAC_LEN]> {
    if text.len() != 2 * MAC_LEN {
        return None;
    }
    let mut bytes = [0u8; MAC_LEN];
    for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(bytes)
}

fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SignatureKey {
        SignatureKey::new(HeaderName::from_static("x-fence-signature"), b"s3cret").unwrap()
    }

    fn sign(secret: &[u8], key: &str, token: u64) -> String {
        sign_token(secret, key, token).unwrap()
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.append("x-fence-signature", value.parse().unwrap());
        headers
    }

    #[test]
    fn a_signature_from_sign_token_verifies_in_either_case() {
        let signature = sign(b"s3cret", "invoice:72", 34);
        assert_eq!(signature.len(), 64);
        assert_eq!(key().verify(&headers(&signature), "invoice:72", 34), Ok(()));
        let upper = signature.to_ascii_uppercase();
        assert_eq!(key().verify(&headers(&upper), "invoice:72", 34), Ok(()));
    }

    #[test]
    fn the_signature_binds_key_token_and_secret() {
        let signature = sign(b"s3cret", "invoice:72", 34);
        let check = |k: &str, t: u64| key().verify(&headers(&signature), k, t);
        assert_eq!(check("invoice:73", 34), Err(SignatureError::Mismatch));
        assert_eq!(check("invoice:72", 35), Err(SignatureError::Mismatch));
        let other = sign(b"other", "invoice:72", 34);
        assert_eq!(
            key().verify(&headers(&other), "invoice:72", 34),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn framing_is_unambiguous() {
        // Key "a1" with token 2 and key "a" with token 12 would collide under plain concatenation.
        assert_eq!(signed_message("a1", 2), b"a1\n2");
        assert_ne!(sign(b"k", "a1", 2), sign(b"k", "a", 12));
    }

    #[test]
    fn missing_repeated_and_malformed_are_told_apart() {
        assert_eq!(
            key().verify(&HeaderMap::new(), "k", 1),
            Err(SignatureError::Missing)
        );
        let signature = sign(b"s3cret", "k", 1);
        let mut twice = headers(&signature);
        twice.append("x-fence-signature", signature.parse().unwrap());
        assert_eq!(key().verify(&twice, "k", 1), Err(SignatureError::Repeated));
        for bad in ["", "zz", &signature[..63], &format!("{signature}0")] {
            assert_eq!(
                key().verify(&headers(bad), "k", 1),
                Err(SignatureError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn debug_output_hides_the_secret() {
        assert!(!format!("{:?}", key()).contains("s3cret"));
    }
}
