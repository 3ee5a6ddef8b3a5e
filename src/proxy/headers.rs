//! Header rules a forwarding proxy must follow: hop-by-hop removal (RFC 9110 §7.6.1), `Via`
//! (RFC 9110 §7.6.3), and `Forwarded` (RFC 7239) with its de-facto `X-Forwarded-*` companions.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;

/// Headers that are hop-by-hop by definition; RFC 9110 §7.6.1 names `Connection`, `Proxy-Connection`,
/// `Keep-Alive`, `TE`, `Transfer-Encoding` and `Upgrade`; `Trailer` and the `Proxy-Auth*` pair are
/// meant for the next hop only as well. Names, not strings: removing by a `HeaderName` skips
/// parsing the name on every request. `Connection` comes first (bit 0 of [`hop_by_hop_bit`]).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// The bit of `name` in a set of [`HOP_BY_HOP`] indices, if it is one of them. A `match` on the
/// lowercase name, which compiles to a length switch and a compare: far fewer instructions, on
/// every message, than comparing `HeaderName`s one by one.
fn hop_by_hop_bit(name: &HeaderName) -> Option<u16> {
    let index = match name.as_str() {
        "connection" => 0,
        "proxy-connection" => 1,
        "keep-alive" => 2,
        "te" => 3,
        "trailer" => 4,
        "transfer-encoding" => 5,
        "upgrade" => 6,
        "proxy-authenticate" => 7,
        "proxy-authorization" => 8,
        _ => return None,
    };
    Some(1 << index)
}

/// Headers through which some servers let a request name another path than its request line's.
const PATH_OVERRIDE_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
];

/// Removes `X-Original-URL` and `X-Rewrite-URL`, which older Symfony and Zend applications and
/// IIS's URL rewriting read as the request's path: the upstream must see only the path the
/// gateway routed.
pub fn strip_path_override_headers(headers: &mut HeaderMap) {
    // One pass over the names (short, compared by length first) instead of a hash per name.
    if headers
        .keys()
        .any(|name| PATH_OVERRIDE_HEADERS.contains(name))
    {
        for name in &PATH_OVERRIDE_HEADERS {
            headers.remove(name);
        }
    }
}

/// Removes hop-by-hop headers: the fixed list plus every header named in `Connection`
/// (RFC 9110 §7.6.1: "a proxy or gateway MUST parse a received Connection header field before a
/// message is forwarded and, for each connection-option in this field, remove any header ... with
/// the same name as the connection-option, and then remove the Connection header field itself").
pub fn strip_hop_by_hop_headers(headers: &mut HeaderMap) {
    // One pass over the few names a message carries; then only the ones found are removed.
    let present = headers
        .keys()
        .filter_map(hop_by_hop_bit)
        .fold(0u16, |set, bit| set | bit);
    if present == 0 {
        return;
    }
    if present & 1 != 0 {
        // Options that are listed names anyway (`keep-alive`) go with the list below.
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|option| HeaderName::from_bytes(option.trim().as_bytes()).ok())
            .filter(|name| hop_by_hop_bit(name).is_none())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << index) != 0 {
            headers.remove(name);
        }
    }
}

/// Appends this hop to `Via`, naming the protocol version the message was received with.
pub fn append_via(headers: &mut HeaderMap, received: Version) {
    let hop = match received {
        Version::HTTP_09 => HeaderValue::from_static("0.9 fencegate"),
        Version::HTTP_10 => HeaderValue::from_static("1.0 fencegate"),
        Version::HTTP_2 => HeaderValue::from_static("2 fencegate"),
        Version::HTTP_3 => HeaderValue::from_static("3 fencegate"),
        _ => HeaderValue::from_static("1.1 fencegate"),
    };
    headers.append(header::VIA, hop);
}

/// A client's address rendered once per connection for the forwarding headers, so a request
/// pays for no address formatting.
#[derive(Debug, Clone)]
pub struct ClientNode {
    /// The address as `X-Forwarded-For` carries it.
    ip: HeaderValue,
    /// The address as a RFC 7239 §6 node: IPv4 as a token, IPv6 bracketed and quoted.
    node: Box<str>,
}

impl ClientNode {
    pub fn new(ip: IpAddr) -> ClientNode {
        let text = ip.to_string();
        let node = match ip {
            IpAddr::V4(_) => text.clone().into_boxed_str(),
            IpAddr::V6(_) => format!("\"[{text}]\"").into_boxed_str(),
        };
        ClientNode {
            // An IP address is always a valid header value.
            ip: HeaderValue::try_from(text).unwrap_or(HeaderValue::from_static("unknown")),
            node,
        }
    }
}

/// Who sent a request to the gateway, and how.
pub struct ForwardedFor<'a> {
    pub client: &'a ClientNode,
    /// The `Host` (or HTTP/2 `:authority`) the client used.
    pub host: Option<&'a HeaderValue>,
    pub proto: &'static str,
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// The headers that say who sent a request, which only this hop may write unless trusted.
const FORWARDING: [HeaderName; 4] = [
    header::FORWARDED,
    X_FORWARDED_FOR,
    X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
];

/// The bit of `name` in a set of [`FORWARDING`] indices, if it is one of them.
fn forwarding_bit(name: &HeaderName) -> Option<u8> {
    let index = match name.as_str() {
        "forwarded" => 0,
        "x-forwarded-for" => 1,
        "x-forwarded-host" => 2,
        "x-forwarded-proto" => 3,
        _ => return None,
    };
    Some(1 << index)
}

/// Adds `Forwarded` (RFC 7239 §4) and `X-Forwarded-For/-Host/-Proto` for this hop. Unless
/// `trust_client` is set, whatever the client sent in those headers is dropped first: a client
/// must not be able to claim another address to the upstream.
pub fn append_forwarded_headers(
    headers: &mut HeaderMap,
    hop: &ForwardedFor<'_>,
    trust_client: bool,
) {
    // Which of the four the client sent, found in one pass; what is not there is inserted
    // without a lookup first.
    let mut present = headers
        .keys()
        .filter_map(forwarding_bit)
        .fold(0u8, |set, bit| set | bit);
    if !trust_client && present != 0 {
        for (index, name) in FORWARDING.iter().enumerate() {
            if present & (1 << index) != 0 {
                headers.remove(name);
            }
        }
        present = 0;
    }
    let host = hop.host.and_then(|h| h.to_str().ok());
    let mut element =
        String::with_capacity(32 + hop.client.node.len() + host.map_or(0, |h| h.len()));
    element.push_str("for=");
    element.push_str(&hop.client.node);
    if let Some(host) = host {
        element.push_str(";host=");
        push_quoted_string(&mut element, host);
    }
    element.push_str(";proto=");
    element.push_str(hop.proto);
    if let Ok(value) = HeaderValue::try_from(element) {
        set_appended(headers, header::FORWARDED, value, present & 1 != 0);
    }
    set_appended(
        headers,
        X_FORWARDED_FOR,
        hop.client.ip.clone(),
        present & 2 != 0,
    );
    if present & 4 == 0 {
        if let Some(value) = hop.host {
            headers.insert(X_FORWARDED_HOST, value.clone());
        }
    }
    if present & 8 == 0 {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(hop.proto));
    }
}

/// RFC 9110 §5.6.4 quoted-string (a host with a port is not a token because of its colon).
fn push_quoted_string(out: &mut String, text: &str) {
    out.push('"');
    if text.contains(['"', '\\']) {
        for c in text.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    } else {
        out.push_str(text);
    }
    out.push('"');
}

/// Sets `name` to `addition`, or, when the header is there (`present`, known to the caller),
/// joins its field lines and `addition` into one comma-separated line.
fn set_appended(headers: &mut HeaderMap, name: HeaderName, addition: HeaderValue, present: bool) {
    if !present {
        headers.insert(name, addition);
        return;
    }
    let mut joined: Vec<&[u8]> = headers
        .get_all(&name)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    joined.push(addition.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&joined.join(&b", "[..])) {
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
    fn the_name_matches_agree_with_the_lists() {
        for (index, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_bit(name), Some(1 << index), "{name}");
        }
        for (index, name) in FORWARDING.iter().enumerate() {
            assert_eq!(forwarding_bit(name), Some(1 << index), "{name}");
        }
        for other in [header::HOST, header::CONTENT_LENGTH, header::VIA] {
            assert_eq!(
                (hop_by_hop_bit(&other), forwarding_bit(&other)),
                (None, None)
            );
        }
    }

    #[test]
    fn only_connection_is_removed_with_what_it_names() {
        let mut headers = map(&[
            ("connection", "Keep-Alive, close, X-Hop, TE"),
            ("x-hop", "1"),
            ("x-keep", "2"),
        ]);
        strip_hop_by_hop_headers(&mut headers);
        let left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-keep"]);
        // Nothing hop-by-hop at all: left as it is.
        let mut plain = map(&[("host", "a"), ("x-fence", "3")]);
        strip_hop_by_hop_headers(&mut plain);
        assert_eq!(plain.len(), 2);
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
        let client = ClientNode::new("10.0.0.9".parse().unwrap());
        let host = HeaderValue::from_static("api.example:8080");
        let hop = ForwardedFor {
            client: &client,
            host: Some(&host),
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
        let client = ClientNode::new("::1".parse().unwrap());
        let hop = ForwardedFor {
            client: &client,
            host: None,
            proto: "http",
        };
        let mut headers = HeaderMap::new();
        append_forwarded_headers(&mut headers, &hop, false);
        assert_eq!(headers["forwarded"], "for=\"[::1]\";proto=http");
    }
}
