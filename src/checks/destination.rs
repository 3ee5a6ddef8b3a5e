//! WebDAV's `Destination` header (RFC 4918 §10.3): `MOVE` and `COPY` write the resource it names,
//! so a request on an unfenced path could overwrite a fenced one through it. The destination is
//! made canonical and routed like a request path; one that lands on a fenced route is refused,
//! and any other is forwarded in its canonical form, so the upstream writes where the gateway
//! looked.

use http::uri::{Scheme, Uri};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::PathParameters;
use crate::route::{canonicalize, PathRefusal, RouteTable};

/// The header MOVE and COPY name their target in.
pub const DESTINATION: HeaderName = HeaderName::from_static("destination");

/// Why a request's `Destination` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationRefusal {
    #[error("the request carries more than one Destination header")]
    Repeated,
    #[error("the Destination header is not an absolute path or an http(s) URL without a query")]
    Unreadable,
    #[error("the Destination header names another host than the request's")]
    OtherHost,
    #[error("the Destination header's path: {0}")]
    Path(PathRefusal),
    #[error("the Destination header names a resource of fenced route {route}, or a collection holding some; write them there with their own tokens instead")]
    Fenced { route: String },
}

/// Checks the request's `Destination`, if it has one, against the route table. `Ok(Some(value))`
/// is the canonical destination to forward in its place.
pub fn check_destination(
    headers: &HeaderMap,
    host: Option<&str>,
    table: &RouteTable,
) -> Result<Option<HeaderValue>, DestinationRefusal> {
    let mut values = headers.get_all(DESTINATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(DestinationRefusal::Repeated);
    }
    let text = value.to_str().map_err(|_| DestinationRefusal::Unreadable)?;
    let (origin, raw_path) = split_destination(text, host)?;
    let path = canonicalize(raw_path).map_err(DestinationRefusal::Path)?;
    // Both readings of `;` parameters, whatever the request's method: what the destination
    // names is written.
    let stripped = path.has_parameters().then(|| path.without_parameters());
    let mut readings = vec![&path];
    readings.extend(stripped.as_ref());
    let mut forward = None;
    for (i, reading) in readings.iter().enumerate() {
        let found = table
            .first_match(reading)
            .map_err(DestinationRefusal::Path)?;
        let fenced = |route: &crate::route::CompiledRoute| DestinationRefusal::Fenced {
            route: route.name.clone(),
        };
        if let Some(route) = table.collection_guard(reading) {
            return Err(fenced(route));
        }
        match found {
            // Whatever the route fences, a MOVE or COPY onto it is a write there.
            Some(found) if found.route.is_guarded() => return Err(fenced(&found.route)),
            Some(found) if i == 1 && found.route.path_parameters == PathParameters::Strip => {
                forward = Some(found.path);
            }
            Some(found) if i == 0 => forward = Some(found.path),
            _ => {}
        }
    }
    let canonical = forward.unwrap_or_else(|| path.as_str().to_owned());
    HeaderValue::from_str(&format!("{origin}{canonical}"))
        .map(Some)
        .map_err(|_| DestinationRefusal::Unreadable)
}

/// A destination's scheme and authority (empty for an absolute path) and its raw path.
fn split_destination<'a>(
    text: &'a str,
    host: Option<&str>,
) -> Result<(String, &'a str), DestinationRefusal> {
    if text.starts_with('/') {
        if text.contains(['?', '#']) {
            return Err(DestinationRefusal::Unreadable);
        }
        return Ok((String::new(), text));
    }
    let uri: Uri = text.parse().map_err(|_| DestinationRefusal::Unreadable)?;
    let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
        return Err(DestinationRefusal::Unreadable);
    };
    if (*scheme != Scheme::HTTP && *scheme != Scheme::HTTPS) || uri.query().is_some() {
        return Err(DestinationRefusal::Unreadable);
    }
    if !host.is_some_and(|host| super::host::same_authority(host, authority.as_str())) {
        return Err(DestinationRefusal::OtherHost);
    }
    // The path as the text spells it (the parsed URI would have added a '/' to an empty one).
    let start = text.find("://").map_or(0, |at| at + 3) + authority.as_str().len();
    let path = &text[start..];
    Ok((
        format!("{scheme}://{authority}"),
        if path.is_empty() { "/" } else { path },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_str;

    fn table() -> RouteTable {
        let text = r#"
[server]
listen = "127.0.0.1:0"

[[routes]]
name = "ledger"
path = "/files/ledger/{name}"
upstream = "http://127.0.0.1:9"
resource_key = "file:{name}"

[[routes]]
name = "rest"
path = "/{*rest}"
upstream = "http://127.0.0.1:9"
[routes.fence]
mode = "off"
"#;
        let config = parse_str(text, std::path::Path::new("t.toml")).unwrap();
        RouteTable::compile(&config.routes).unwrap()
    }

    fn check(destination: &str) -> Result<Option<HeaderValue>, DestinationRefusal> {
        let mut headers = HeaderMap::new();
        headers.insert(DESTINATION, HeaderValue::from_str(destination).unwrap());
        check_destination(&headers, Some("gw:8080"), &table())
    }

    #[test]
    fn a_destination_on_or_above_a_fenced_route_is_refused_however_it_is_spelled() {
        for destination in [
            "/files/ledger/acct1",
            "/files//ledger/acct1",
            "/Files/Ledger/acct1/",
            "/files/%6Cedger/acct1",
            "http://gw:8080/files/ledger/acct1",
            "http://GW:8080//files/ledger/acct1",
            // Both readings of `;` parameters.
            "/files/ledger;x/acct1",
            "/files/ledger/acct1;v=1",
            // Collections holding the fenced resources.
            "/files/ledger/",
            "/files",
            "/",
        ] {
            assert_eq!(
                check(destination),
                Err(DestinationRefusal::Fenced {
                    route: "ledger".into()
                }),
                "{destination}"
            );
        }
    }

    #[test]
    fn other_destinations_are_forwarded_canonical() {
        assert_eq!(
            check("/files//public/%61").unwrap().unwrap(),
            "/files/public/a"
        );
        assert_eq!(
            check("http://gw:8080/files//x").unwrap().unwrap(),
            "http://gw:8080/files/x"
        );
        assert_eq!(
            check("/files/public/a;b").unwrap().unwrap(),
            "/files/public/a;b"
        );
    }

    #[test]
    fn unreadable_destinations_are_refused() {
        assert_eq!(check("http://other/x"), Err(DestinationRefusal::OtherHost));
        assert_eq!(check("files/x"), Err(DestinationRefusal::Unreadable));
        assert_eq!(
            check("ftp://gw:8080/x"),
            Err(DestinationRefusal::Unreadable)
        );
        assert_eq!(check("/x?y=1"), Err(DestinationRefusal::Unreadable));
        assert_eq!(
            check("/public/../files/ledger/acct1"),
            Err(DestinationRefusal::Path(PathRefusal::DotSegment))
        );
        let mut two = HeaderMap::new();
        two.append(DESTINATION, HeaderValue::from_static("/a"));
        two.append(DESTINATION, HeaderValue::from_static("/b"));
        assert_eq!(
            check_destination(&two, None, &table()),
            Err(DestinationRefusal::Repeated)
        );
    }
}
