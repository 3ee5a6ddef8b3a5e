//! Header rules a forwarding proxy must follow: hop-by-hop removal (RFC 9110 §7.6.1), `Via`
//! (RFC 9110 §7.6.3), and `Forwarded` (RFC 7239) with its de-facto `X-Forwarded-*` companions.

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;

/// The pseudonym this proxy uses in `Via` (RFC 9110 §7.6.3 allows a pseudonym instead of a host).
const VIA_PSEUDONYM: &str = "fencegate";

/// Headers that are hop-by-hop by definition; RFC 9110 §7.6.1 names `Connection`, `Proxy-Connection`,
/// `Keep-Alive`, `TE`, `Transfer-Encoding` and `Upgrade`; `Trailer` and the `Proxy-Auth*` pair are
/// meant for the next hop only as well.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Removes hop-by-hop headers: the fixed list plus every header named in `Connection`
/// (RFC 9110 §7.6.1: "a proxy or gateway MUST parse a received Connection header field before a
/// message is forwarded and, for each connection-option in this field, remove any header ... with
/// the same name as the connection-option, and then remove the Connection header field itself").
pub fn strip_hop_by_hop_headers(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|option| HeaderName::from_bytes(option.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Appends this hop to `Via`, naming the protocol version the message was received with.
pub fn append_via(headers: &mut HeaderMap, received: Version) {
    let protocol = match received {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    };
    let hop = HeaderValue::from_str(&format!("{protocol} {VIA_PSEUDONYM}"));
    if let Ok(hop) = hop {
        headers.append(header::VIA, hop);
    }
}

/// Who sent a request to the gateway, and how.
pub struct ForwardedFor<'a> {
    pub client: SocketAddr,
    /// The `Host` (or HTTP/2 `:authority`) the client used.
    pub host: Option<&'a str>,
    pub proto: &'static str,
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Adds `Forwarded` (RFC 7239 §4) and `X-Forwarded-For/-Host/-Proto` for this hop. Unless
/// `trust_client` is set, whatever the client sent in those headers is dropped first: a client
/// must not be able to claim another address to the upstream.
pub fn append_forwarded_headers(
    headers: &mut HeaderMap,
    hop: &ForwardedFor<'_>,
    trust_client: bool,
) {
    if !trust_client {
        for name in [
            header::FORWARDED,
            X_FORWARDED_FOR,
            X_FORWARDED_HOST,
            X_FORWARDED_PROTO,
        ] {
            headers.remove(name);
        }
    }
    let ip = hop.client.ip();
    let mut element = format!("for={}", forwarded_node(ip));
    if let Some(host) = hop.host {
        element.push_str(";host=");
        element.push_str(&quoted_string(host));
    }
    element.push_str(";proto=");
    element.push_str(hop.proto);
    set_appended(headers, header::FORWARDED, &element);
    set_appended(headers, X_FORWARDED_FOR, &ip.to_string());
    if !headers.contains_key(&X_FORWARDED_HOST) {
        if let Some(value) = hop.host.and_then(|h| HeaderValue::from_str(h).ok()) {
            headers.insert(X_FORWARDED_HOST, value);
        }
    }
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(hop.proto));
    }
}

/// RFC 7239 §6: IPv6 nodes are bracketed and quoted; IPv4 nodes are tokens.
fn forwarded_node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// RFC 9110 §5.6.4 quoted-string (a host with a port is not a token because of its colon).
fn quoted_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// Joins any existing field lines of `name` and `addition` into one comma-separated line.
fn set_appended(headers: &mut HeaderMap, name: HeaderName, addition: &str) {
    let mut joined: Vec<&str> = headers
        .get_all(&name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    joined.push(addition);
    if let Ok(value) = HeaderValue::from_str(&joined.join(", ")) {
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut headers = map(&[
            ("connection", "keep-alive, X-Secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic x"),
            ("x-fence", "7"),
            ("content-length", "3"),
        ]);
        strip_hop_by_hop_headers(&mut headers);
        let left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-fence", "content-length"]);
    }

    #[test]
    fn via_names_the_received_version() {
        let mut headers = map(&[("via", "1.0 edge")]);
        append_via(&mut headers, Version::HTTP_2);
        let all: Vec<_> = headers.get_all("via").iter().collect();
        assert_eq!(all, ["1.0 edge", "2 fencegate"]);
    }

    #[test]
    fn client_forwarded_headers_are_replaced_unless_trusted() {
        let hop = ForwardedFor {
            client: "10.0.0.9:5000".parse().unwrap(),
            host: Some("api.example:8080"),
            proto: "http",
        };
        let sent = [("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=1.2.3.4")];
        let mut untrusted = map(&sent);
        append_forwarded_headers(&mut untrusted, &hop, false);
        assert_eq!(untrusted["x-forwarded-for"], "10.0.0.9");
        assert_eq!(
            untrusted["forwarded"],
            "for=10.0.0.9;host=\"api.example:8080\";proto=http"
        );
        assert_eq!(untrusted["x-forwarded-host"], "api.example:8080");
        assert_eq!(untrusted["x-forwarded-proto"], "http");

        let mut trusted = map(&sent);
        append_forwarded_headers(&mut trusted, &hop, true);
        assert_eq!(trusted["x-forwarded-for"], "1.2.3.4, 10.0.0.9");
        assert!(trusted["forwarded"]
            .to_str()
            .unwrap()
            .starts_with("for=1.2.3.4, for=10.0.0.9"));
    }

    #[test]
    fn ipv6_clients_are_quoted_in_forwarded() {
        let hop = ForwardedFor {
            client: "[::1]:5000".parse().unwrap(),
            host: None,
            proto: "http",
        };
        let mut headers = HeaderMap::new();
        append_forwarded_headers(&mut headers, &hop, false);
        assert_eq!(headers["forwarded"], "for=\"[::1]\";proto=http");
    }
}
