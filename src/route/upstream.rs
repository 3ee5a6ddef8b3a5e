//! An upstream base URL (`http://host:port/base` or `https://…`) and how a request path is placed
//! below it.

use std::sync::Arc;

use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::HeaderValue;

#[derive(Debug, Clone)]
pub struct UpstreamTarget {
    scheme: Scheme,
    authority: Authority,
    /// The base path without a trailing slash (empty for the root).
    base_path: String,
    host_header: HeaderValue,
    /// `host:port`, the port made explicit: the name of the upstream's connection slots (and of
    /// its pooled connections, shared with each response that hands one back).
    slot: Arc<str>,
    /// `scheme://authority/`: what a connection is opened to.
    origin: Uri,
}

/// The base URL, as configured less a trailing slash.
impl std::fmt::Display for UpstreamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

impl UpstreamTarget {
    /// Parses a route's `upstream`; the message says what is wrong.
    pub fn parse(text: &str) -> Result<UpstreamTarget, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        let scheme = match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => Scheme::HTTP,
            Some(scheme) if *scheme == Scheme::HTTPS => Scheme::HTTPS,
            _ => return Err(format!("{text:?} must start with http:// or https://")),
        };
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("{text:?} has no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "{text:?}: credentials in the URL are not supported"
            ));
        }
        if uri.query().is_some() {
            return Err(format!(
                "{text:?}: an upstream base URL cannot have a query"
            ));
        }
        let host_header = HeaderValue::from_str(authority.as_str())
            .map_err(|e| format!("{text:?}: bad host: {e}"))?;
        let port = authority
            .port_u16()
            .unwrap_or(if scheme == Scheme::HTTPS { 443 } else { 80 });
        let slot: Arc<str> = format!("{}:{port}", authority.host()).into();
        let origin = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| format!("{text:?}: {e}"))?;
        Ok(UpstreamTarget {
            scheme,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            authority,
            host_header,
            slot,
            origin,
        })
    }

    /// The origin-form request target (what an HTTP/1.1 request line carries to the upstream)
    /// for a request to `uri`, below the base path. Without a base path, the request's own
    /// path and query are kept as they were parsed (no copy, no second parse).
    pub fn origin_form_for(&self, uri: &Uri) -> Result<Uri, http::Error> {
        let path_and_query = uri.path_and_query();
        if self.base_path.is_empty() {
            if uri.scheme().is_none() && uri.authority().is_none() && path_and_query.is_some() {
                return Ok(uri.clone());
            }
            let mut parts = http::uri::Parts::default();
            parts.path_and_query = Some(
                path_and_query
                    .cloned()
                    .unwrap_or_else(|| PathAndQuery::from_static("/")),
            );
            return Uri::from_parts(parts).map_err(Into::into);
        }
        let path_and_query = path_and_query.map_or("/", PathAndQuery::as_str);
        let mut target = String::with_capacity(self.base_path.len() + path_and_query.len());
        target.push_str(&self.base_path);
        target.push_str(path_and_query);
        Uri::try_from(target).map_err(Into::into)
    }

    /// The name of the upstream's connection slots (`host:port`).
    pub fn slot_name(&self) -> String {
        self.slot.to_string()
    }

    /// [`slot_name`](Self::slot_name), shared.
    pub fn slot(&self) -> &Arc<str> {
        &self.slot
    }

    /// `scheme://authority/`: what a connection to the upstream is opened to.
    pub fn origin(&self) -> &Uri {
        &self.origin
    }

    /// Whether requests go over TLS.
    pub fn is_https(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &str {
        self.scheme.as_str()
    }

    /// The `Host` header value naming the upstream.
    pub fn host_header(&self) -> &HeaderValue {
        &self.host_header
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_form_goes_below_the_base_path() {
        for (base, path, expected) in [
            (
                "http://127.0.0.1:9000/api/",
                "/invoices/7?x=1",
                "/api/invoices/7?x=1",
            ),
            ("http://127.0.0.1:9000", "/a", "/a"),
            ("http://127.0.0.1:9000", "/a?b=%2F&c", "/a?b=%2F&c"),
            ("https://api.example.com/v1", "/charges", "/v1/charges"),
        ] {
            let t = UpstreamTarget::parse(base).unwrap();
            // The same target from an origin-form and an absolute-form request line.
            for uri in [path.to_owned(), format!("http://client.example{path}")] {
                let origin = t.origin_form_for(&uri.parse().unwrap()).unwrap();
                assert_eq!(origin.authority(), None, "{base} {uri}");
                assert_eq!(origin.scheme(), None, "{base} {uri}");
                assert_eq!(origin.to_string(), expected, "{base} {uri}");
            }
        }
        // An absolute-form target without a path goes to the root.
        let root = UpstreamTarget::parse("http://127.0.0.1:9000").unwrap();
        let origin = root
            .origin_form_for(&"http://client.example".parse().unwrap())
            .unwrap();
        assert_eq!(origin.to_string(), "/");
        assert_eq!(
            UpstreamTarget::parse("http://h")
                .unwrap()
                .origin()
                .to_string(),
            "http://h/"
        );
        assert_eq!(&**UpstreamTarget::parse("http://h").unwrap().slot(), "h:80");
    }

    #[test]
    fn unsupported_upstreams_are_rejected_and_https_is_accepted() {
        assert!(UpstreamTarget::parse("https://x").is_ok_and(|t| t.is_https()));
        assert_eq!(
            UpstreamTarget::parse("https://api.example.com/v1")
                .unwrap()
                .origin()
                .to_string(),
            "https://api.example.com/"
        );
        assert_eq!(
            UpstreamTarget::parse("https://x").unwrap().slot_name(),
            "x:443"
        );
        assert!(UpstreamTarget::parse("ftp://x").is_err());
        assert!(UpstreamTarget::parse("/relative").is_err());
        assert!(UpstreamTarget::parse("http://x/?q=1").is_err());
        assert!(UpstreamTarget::parse("http://u:p@x/").is_err());
    }
}
