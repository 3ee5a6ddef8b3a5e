//! Which request methods a route fences, and which method spellings the gateway refuses. Method
//! names are case-sensitive in HTTP (RFC 9110 §9.1), but Werkzeug and ASP.NET upper-case them, so
//! `put` would be a write there while it is no known method here: the gateway refuses such
//! spellings, and compares the methods a route lists ASCII-case-insensitively.

use http::Method;

/// The methods a route leaves unfenced unless it lists its fenced methods: the safe methods of
/// RFC 9110 §9.2.1, spelled exactly so.
pub const UNFENCED_METHODS: [Method; 4] = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE];

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
#[error("method {spelled:?} is {canonical} in another letter case; send it as {canonical}")]
pub struct MethodRefusal {
    pub spelled: String,
    pub canonical: &'static str,
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
        Some(canonical) => Err(MethodRefusal {
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
        for name in ["put", "Put", "post", "delete", "get", "move", "Copy", "pRoPpAtCh"] {
            let refusal = check_method_spelling(&method(name)).unwrap_err();
            assert!(refusal.canonical.eq_ignore_ascii_case(name), "{name}");
        }
        for name in ["PUT", "GET", "MOVE", "FOO", "frobnicate", "X-custom"] {
            assert_eq!(check_method_spelling(&method(name)), Ok(()), "{name}");
        }
    }

    #[test]
    fn every_method_but_the_safe_ones_is_fenced_by_default() {
        let all = FencedMethods::AllButSafe;
        for name in ["POST", "PUT", "PATCH", "DELETE", "MOVE", "COPY", "MERGE", "FOO", "frob"] {
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
