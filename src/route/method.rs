//! Which request methods a route fences, and which method spellings the gateway refuses. Method
//! names are case-sensitive in HTTP (RFC 9110 §9.1), but Werkzeug and ASP.NET upper-case them, so
//! `put` would be a write there while it is no known method here: the gateway refuses such
//! spellings, and compares the methods a route lists ASCII-case-insensitively.

use http::Method;

/// The methods a route leaves unfenced unless it lists its fenced methods: the safe methods of
/// RFC 9110 §9.2.1, spelled exactly so.
pub const UNFENCED_METHODS: [Method; 4] =
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE];

/// Registered methods (RFC 9110, RFC 5789, the WebDAV family and the IANA method registry). A
/// request spelling one of them in another letter case is refused: an upstream that upper-cases
/// methods would read it as that method.
const REGISTERED_METHODS: &[&str] = &[
    "ACL",
    "BASELINE-CONTROL",
    "BIND",
    "CHECKIN",
    "CHECKOUT",
    "CONNECT",
    "COPY",
    "DELETE",
    "GET",
    "HEAD",
    "LABEL",
    "LINK",
    "LOCK",
    "MERGE",
    "MKACTIVITY",
    "MKCALENDAR",
    "MKCOL",
    "MKREDIRECTREF",
    "MKWORKSPACE",
    "MOVE",
    "OPTIONS",
    "ORDERPATCH",
    "PATCH",
    "POST",
    "PRI",
    "PROPFIND",
    "PROPPATCH",
    "PUT",
    "QUERY",
    "REBIND",
    "REPORT",
    "SEARCH",
    "TRACE",
    "UNBIND",
    "UNCHECKOUT",
    "UNLINK",
    "UNLOCK",
    "UPDATE",
    "UPDATEREDIRECTREF",
    "VERSION-CONTROL",
];

/// A method the gateway will not read (400 `invalid-method`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MethodRefusal {
    #[error("method {spelled:?} is {canonical} in another letter case; send it as {canonical}")]
    OtherCase {
        spelled: String,
        canonical: &'static str,
    },
    #[error("the request overrides its method with {0}, which some frameworks honour; send the method itself")]
    Override(String),
}

/// Headers through which Rails, Symfony, Express's method-override and others let a request
/// claim another method than its own.
const OVERRIDE_HEADERS: [http::HeaderName; 3] = [
    http::HeaderName::from_static("x-http-method-override"),
    http::HeaderName::from_static("x-http-method"),
    http::HeaderName::from_static("x-method-override"),
];

/// Refuses a request that names another method for itself: an override header, or Symfony's and
/// Laravel's `_method` query parameter. (A `_method` field in a form body is not seen here.)
pub fn check_method_override(
    headers: &http::HeaderMap,
    query: Option<&str>,
) -> Result<(), MethodRefusal> {
    if let Some(name) = OVERRIDE_HEADERS.iter().find(|h| headers.contains_key(*h)) {
        return Err(MethodRefusal::Override(name.as_str().to_owned()));
    }
    let names_method = |pair: &str| {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        let name = name.split_once('[').map_or(name, |(base, _)| base);
        name.eq_ignore_ascii_case("_method") || name.eq_ignore_ascii_case("%5Fmethod")
    };
    if query.is_some_and(|q| q.split(['&', ';']).any(names_method)) {
        return Err(MethodRefusal::Override(
            "the _method query parameter".to_owned(),
        ));
    }
    Ok(())
}

/// Refuses a registered method spelled in another letter case (`put`, `Post`, `move`).
pub fn check_method_spelling(method: &Method) -> Result<(), MethodRefusal> {
    let spelled = method.as_str();
    if !spelled.bytes().any(|b| b.is_ascii_lowercase()) {
        return Ok(());
    }
    match REGISTERED_METHODS
        .iter()
        .find(|known| known.eq_ignore_ascii_case(spelled))
    {
        Some(canonical) => Err(MethodRefusal::OtherCase {
            spelled: spelled.to_owned(),
            canonical,
        }),
        None => Ok(()),
    }
}

/// The methods one route fences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencedMethods {
    /// Every method but [`UNFENCED_METHODS`], whatever its spelling: the default.
    AllButSafe,
    /// Exactly these (compared ASCII-case-insensitively): the route listed them.
    Listed(Vec<Method>),
}

impl FencedMethods {
    /// Whether a request with `method` is fenced.
    pub fn contains(&self, method: &Method) -> bool {
        match self {
            FencedMethods::AllButSafe => !UNFENCED_METHODS.contains(method),
            FencedMethods::Listed(methods) => methods
                .iter()
                .any(|m| m.as_str().eq_ignore_ascii_case(method.as_str())),
        }
    }

    /// The methods as the admin API lists them; `*` stands for "every method but the safe ones".
    pub fn describe(&self) -> Vec<String> {
        match self {
            FencedMethods::AllButSafe => {
                let mut all = vec!["*".to_owned()];
                all.extend(UNFENCED_METHODS.iter().map(|m| format!("!{m}")));
                all
            }
            FencedMethods::Listed(methods) => methods.iter().map(|m| m.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(name: &str) -> Method {
        Method::from_bytes(name.as_bytes()).unwrap()
    }

    #[test]
    fn other_spellings_of_registered_methods_are_refused() {
        for name in [
            "put",
            "Put",
            "post",
            "delete",
            "get",
            "move",
            "Copy",
            "pRoPpAtCh",
        ] {
            let refusal = check_method_spelling(&method(name)).unwrap_err();
            let MethodRefusal::OtherCase { canonical, .. } = refusal else {
                panic!("{name}: {refusal:?}");
            };
            assert!(canonical.eq_ignore_ascii_case(name), "{name}");
        }
        for name in ["PUT", "GET", "MOVE", "FOO", "frobnicate", "X-custom"] {
            assert_eq!(check_method_spelling(&method(name)), Ok(()), "{name}");
        }
    }

    #[test]
    fn method_overrides_are_refused() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(
            check_method_override(&headers, Some("a=1&method=x")),
            Ok(())
        );
        for query in [
            "_method=PUT",
            "a=1&_METHOD=delete",
            "x=1;_method=PUT",
            "%5Fmethod=PUT",
            "_method[]=PUT",
        ] {
            assert!(
                check_method_override(&headers, Some(query)).is_err(),
                "{query}"
            );
        }
        headers.insert("x-http-method-override", "PUT".parse().unwrap());
        assert_eq!(
            check_method_override(&headers, None),
            Err(MethodRefusal::Override("x-http-method-override".to_owned()))
        );
    }

    #[test]
    fn every_method_but_the_safe_ones_is_fenced_by_default() {
        let all = FencedMethods::AllButSafe;
        for name in [
            "POST", "PUT", "PATCH", "DELETE", "MOVE", "COPY", "MERGE", "FOO", "frob",
        ] {
            assert!(all.contains(&method(name)), "{name}");
        }
        for name in ["GET", "HEAD", "OPTIONS", "TRACE"] {
            assert!(!all.contains(&method(name)), "{name}");
        }
        // Only the exact spelling is safe: `get` is no known method to an upstream that reads
        // methods case-sensitively.
        assert!(all.contains(&method("get")));
    }

    #[test]
    fn listed_methods_compare_case_insensitively() {
        let listed = FencedMethods::Listed(vec![Method::PUT, method("FROB")]);
        assert!(listed.contains(&method("put")));
        assert!(listed.contains(&method("frob")));
        assert!(!listed.contains(&Method::POST));
    }
}
