//! The `Host` rules of RFC 9112 §3.2 and RFC 9113 §8.3.1: one `Host`, agreeing with the target's
//! authority when the request carries one (absolute-form, or HTTP/2's `:authority`). An upstream
//! that routes by host, or a `preserve_host` route, must not pick a different host than the one
//! the gateway saw.

use http::{header, Request, Version};

/// Why a request's host was refused (400 `invalid-host`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostRefusal {
    #[error("the request carries more than one Host header")]
    Repeated,
    #[error("the HTTP/1.1 request carries no Host header")]
    Missing,
    #[error("the Host header is not a valid host[:port]")]
    Invalid,
    #[error("the Host header names another host than the request target's authority")]
    Mismatch,
}

/// Checks a request's `Host` against the rules above.
pub fn check_host<B>(request: &Request<B>) -> Result<(), HostRefusal> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(HostRefusal::Repeated);
    }
    let target = request.uri().authority();
    let Some(host) = host else {
        // HTTP/1.0 may omit Host; HTTP/2 names its authority in `:authority`.
        return match (request.version(), target) {
            (Version::HTTP_11, None) => Err(HostRefusal::Missing),
            _ => Ok(()),
        };
    };
    let host = host.to_str().map_err(|_| HostRefusal::Invalid)?;
    if !is_host_and_port(host) {
        return Err(HostRefusal::Invalid);
    }
    match target {
        Some(target) if !same_authority(target.as_str(), host) => Err(HostRefusal::Mismatch),
        _ => Ok(()),
    }
}

/// Whether `text` is a `host[:port]` (RFC 3986 §3.2.2–3.2.3): a registered name or IPv4 address
/// of unreserved characters, sub-delimiters and escapes, or a bracketed IPv6 literal, then an
/// optional port of digits. No user information (`@`), no path, nothing empty.
fn is_host_and_port(text: &str) -> bool {
    let (host, port) = match text.strip_prefix('[') {
        Some(literal) => match literal.split_once(']') {
            Some((address, rest))
                if !address.is_empty()
                    && address
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.') =>
            {
                (address, rest)
            }
            _ => return false,
        },
        None => {
            let end = text.find(':').unwrap_or(text.len());
            let host = &text[..end];
            let name = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b);
            if host.is_empty() || !host.bytes().all(name) {
                return false;
            }
            (host, &text[end..])
        }
    };
    !host.is_empty()
        && match port.strip_prefix(':') {
            None => port.is_empty(),
            Some(digits) => digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit()),
        }
}

/// Whether two authorities name the same host and port: compared without case, a default port
/// (`:80`, `:443`) written on one side and not the other being the same.
pub fn same_authority(a: &str, b: &str) -> bool {
    let bare = |text: &str| {
        let text = text.to_ascii_lowercase();
        match text
            .strip_suffix(":80")
            .or_else(|| text.strip_suffix(":443"))
        {
            Some(host) => host.to_owned(),
            None => text,
        }
    };
    a.eq_ignore_ascii_case(b) || bare(a) == bare(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(target: &str, version: Version, hosts: &[&str]) -> Request<()> {
        let mut builder = Request::builder().uri(target).version(version);
        for host in hosts {
            builder = builder.header(header::HOST, *host);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn one_host_that_agrees_with_the_target_passes() {
        let ok = [
            request("/a", Version::HTTP_11, &["example.com"]),
            request("/a", Version::HTTP_11, &["example.com:8080"]),
            request("http://Example.com/a", Version::HTTP_11, &["example.COM"]),
            request(
                "http://example.com:80/a",
                Version::HTTP_11,
                &["example.com"],
            ),
            request("http://example.com/a", Version::HTTP_2, &[]),
            request("/a", Version::HTTP_10, &[]),
            request("/a", Version::HTTP_11, &["[::1]:8080"]),
            request("/a", Version::HTTP_11, &["127.0.0.1:0"]),
        ];
        for r in ok {
            assert_eq!(check_host(&r), Ok(()), "{r:?}");
        }
    }

    #[test]
    fn repeated_missing_invalid_or_disagreeing_hosts_are_refused() {
        let cases = [
            (
                request("/a", Version::HTTP_11, &["a", "a"]),
                HostRefusal::Repeated,
            ),
            (
                request("/a", Version::HTTP_11, &["a", "b"]),
                HostRefusal::Repeated,
            ),
            (request("/a", Version::HTTP_11, &[]), HostRefusal::Missing),
            (
                request("/a", Version::HTTP_11, &["a b"]),
                HostRefusal::Invalid,
            ),
            (
                request("/a", Version::HTTP_11, &["u@a"]),
                HostRefusal::Invalid,
            ),
            (
                request("/a", Version::HTTP_11, &["a/b"]),
                HostRefusal::Invalid,
            ),
            (
                request("http://other/a", Version::HTTP_11, &["a"]),
                HostRefusal::Mismatch,
            ),
            (
                request("http://a:81/a", Version::HTTP_11, &["a"]),
                HostRefusal::Mismatch,
            ),
            (
                request("http://a/x", Version::HTTP_2, &["b"]),
                HostRefusal::Mismatch,
            ),
        ];
        for (r, why) in cases {
            assert_eq!(check_host(&r), Err(why), "{r:?}");
        }
    }
}
