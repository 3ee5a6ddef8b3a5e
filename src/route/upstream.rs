//! An upstream base URL (`http://host:port/base`) and how a request path is placed below it.

use http::uri::{Authority, Scheme, Uri};
use http::HeaderValue;

#[derive(Debug, Clone)]
pub struct UpstreamTarget {
    authority: Authority,
    /// The base path without a trailing slash (empty for the root).
    base_path: String,
    host_header: HeaderValue,
}

impl UpstreamTarget {
    /// Parses a route's `upstream`; the message says what is wrong.
    pub fn parse(text: &str) -> Result<UpstreamTarget, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => {}
            Some(scheme) if *scheme == Scheme::HTTPS => {
                return Err(format!(
                    "{text:?}: https upstreams are not supported yet; use http:// (e.g. a local sidecar)"
                ))
            }
            _ => return Err(format!("{text:?} must start with http://")),
        }
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
        Ok(UpstreamTarget {
            base_path: uri.path().trim_end_matches('/').to_owned(),
            authority,
            host_header,
        })
    }

    /// The absolute URI for a request whose path and query are `path_and_query` (passed through
    /// unchanged below the base path).
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        let mut target = String::with_capacity(self.base_path.len() + path_and_query.len());
        target.push_str(&self.base_path);
        target.push_str(path_and_query);
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(target)
            .build()
    }

    /// The name of the upstream's connection slots (`host:port`).
    pub fn slot_name(&self) -> String {
        let port = self.authority.port_u16().unwrap_or(80);
        format!("{}:{port}", self.authority.host())
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
    fn path_goes_below_the_base_path() {
        let t = UpstreamTarget::parse("http://127.0.0.1:9000/api/").unwrap();
        assert_eq!(
            t.uri_for("/invoices/7?x=1").unwrap().to_string(),
            "http://127.0.0.1:9000/api/invoices/7?x=1"
        );
        let root = UpstreamTarget::parse("http://127.0.0.1:9000").unwrap();
        assert_eq!(
            root.uri_for("/a").unwrap().to_string(),
            "http://127.0.0.1:9000/a"
        );
    }

    #[test]
    fn unsupported_upstreams_are_rejected() {
        assert!(UpstreamTarget::parse("https://x").is_err());
        assert!(UpstreamTarget::parse("ftp://x").is_err());
        assert!(UpstreamTarget::parse("/relative").is_err());
        assert!(UpstreamTarget::parse("http://x/?q=1").is_err());
        assert!(UpstreamTarget::parse("http://u:p@x/").is_err());
    }
}
