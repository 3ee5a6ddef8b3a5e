//! An upstream base URL (`http://host:port/base` or `https://…`) and how a request path is placed
//! below it.

use http::uri::{Authority, Scheme, Uri};
use http::HeaderValue;

#[derive(Debug, Clone)]
pub struct UpstreamTarget {
    scheme: Scheme,
    authority: Authority,
    /// The base path without a trailing slash (empty for the root).
    base_path: String,
    host_header: HeaderValue,
    /// `host:port`, the port made explicit: the name of the upstream's connection slots.
    slot: String,
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
        let slot = format!("{}:{port}", authority.host());
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
    /// for a request whose path and query are `path_and_query`, below the base path.
    pub fn origin_form_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        if self.base_path.is_empty() {
            return Uri::try_from(path_and_query).map_err(Into::into);
        }
        let mut target = String::with_capacity(self.base_path.len() + path_and_query.len());
        target.push_str(&self.base_path);
        target.push_str(path_and_query);
        Uri::try_from(target).map_err(Into::into)
    }

    /// The name of the upstream's connection slots (`host:port`).
    pub fn slot_name(&self) -> String {
        self.slot.clone()
    }

    /// [`slot_name`](Self::slot_name), borrowed.
    pub fn slot(&self) -> &str {
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
            let origin = t.origin_form_for(path).unwrap();
            assert_eq!(origin.authority(), None);
            assert_eq!(origin.to_string(), expected, "{base} {path}");
        }
        assert_eq!(
            UpstreamTarget::parse("http://h")
                .unwrap()
                .origin()
                .to_string(),
            "http://h/"
        );
        assert_eq!(UpstreamTarget::parse("http://h").unwrap().slot(), "h:80");
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
