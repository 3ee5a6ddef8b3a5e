//! A route's `upstream_headers` (set on every forwarded request, with `${NAME}` read from the
//! environment once, at start) and `strip_response_headers`, compiled. Values are marked
//! sensitive and never printed: they are usually the provider's credentials.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue};

/// Headers that describe the message or the connection: setting them from the configuration
/// would change how the request is framed or routed, so they are refused.
const NOT_SETTABLE: [&str; 11] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "expect",
    "x-fence",
];

/// The headers a route sets upstream; `Debug` shows their names only.
#[derive(Clone, Default)]
pub struct UpstreamHeaders {
    set: Vec<(HeaderName, HeaderValue)>,
}

impl std::fmt::Debug for UpstreamHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.set.iter().map(|(name, _)| name))
            .finish()
    }
}

/// Why a header did not compile: the message names the header (and variable), never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HeaderError(pub String);

impl UpstreamHeaders {
    /// Compiles the table, reading `${NAME}` references with `env`.
    pub fn compile(
        table: &BTreeMap<String, String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<UpstreamHeaders, HeaderError> {
        let mut set = Vec::with_capacity(table.len());
        for (name, template) in table {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| HeaderError(format!("{name:?} is not a header name")))?;
            if NOT_SETTABLE.contains(&header.as_str()) {
                return Err(HeaderError(format!(
                    "{name} cannot be set: it frames or routes the request"
                )));
            }
            let text = expand(name, template, &env)?;
            let mut value = HeaderValue::from_str(&text).map_err(|_| {
                HeaderError(format!(
                    "the value of {name} is not a valid header value (after reading the environment)"
                ))
            })?;
            value.set_sensitive(true);
            set.push((header, value));
        }
        Ok(UpstreamHeaders { set })
    }

    /// Sets every header on `headers`, replacing any value the client sent.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The names set, for the admin API and logs.
    pub fn names(&self) -> impl Iterator<Item = &HeaderName> {
        self.set.iter().map(|(name, _)| name)
    }
}

/// Replaces every `${NAME}` in `template` with that variable's value, and every `${file:PATH}`
/// with that file's text (without its last line end); a variable that is unset or empty, or a
/// file that cannot be read or is empty, is an error (a credential silently sent empty would be
/// worse).
fn expand(
    header: &str,
    template: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<String, HeaderError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| HeaderError(format!("{header}: \"${{\" without a closing \"}}\"")))?;
        let variable = &after[..end];
        if let Some(path) = variable.strip_prefix("file:") {
            let text = crate::config::secret::from_file(std::path::Path::new(path))
                .map_err(|e| HeaderError(format!("{header}: {e}")))?;
            out.push_str(&text);
            rest = &after[end + 1..];
            continue;
        }
        if variable.is_empty()
            || !variable
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(HeaderError(format!(
                "{header}: ${{{variable}}} is not an environment variable name"
            )));
        }
        match env(variable) {
            Some(value) if !value.is_empty() => out.push_str(&value),
            _ => {
                return Err(HeaderError(format!(
                    "{header}: environment variable {variable} is not set (or empty)"
                )))
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Compiles `strip_response_headers`.
pub fn compile_strip_list(names: &[String]) -> Result<Vec<HeaderName>, HeaderError> {
    names
        .iter()
        .map(|name| {
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| HeaderError(format!("{name:?} is not a header name")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn env(name: &str) -> Option<String> {
        (name == "SECRET").then(|| "sk_test_123".to_owned())
    }

    #[test]
    fn variables_are_read_and_values_hidden() {
        let headers = UpstreamHeaders::compile(
            &table(&[("Authorization", "Bearer ${SECRET}"), ("X-Plain", "a$b")]),
            env,
        )
        .unwrap();
        let mut map = HeaderMap::new();
        map.insert("authorization", HeaderValue::from_static("Bearer client"));
        headers.apply(&mut map);
        assert_eq!(map["authorization"], "Bearer sk_test_123");
        assert!(map["authorization"].is_sensitive());
        assert_eq!(map["x-plain"], "a$b");
        let shown = format!("{headers:?}");
        assert!(!shown.contains("sk_test"), "{shown}");
        assert!(shown.contains("authorization"), "{shown}");
    }

    #[test]
    fn unset_variables_and_framing_headers_are_refused() {
        let missing = UpstreamHeaders::compile(&table(&[("Authorization", "Bearer ${NOPE}")]), env)
            .unwrap_err();
        assert!(missing.0.contains("NOPE is not set"), "{missing}");
        for name in ["Host", "Content-Length", "Transfer-Encoding", "X-Fence"] {
            assert!(UpstreamHeaders::compile(&table(&[(name, "1")]), env).is_err());
        }
        assert!(UpstreamHeaders::compile(&table(&[("A", "${SECRET")]), env).is_err());
        assert!(UpstreamHeaders::compile(&table(&[("A", "${a-b}")]), env).is_err());
    }

    #[test]
    fn files_are_read_without_their_line_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api-key");
        std::fs::write(&path, "AQE-key-from-a-mount\n").unwrap();
        let template = format!("${{file:{}}}", path.display());
        let headers = UpstreamHeaders::compile(&table(&[("X-API-Key", &template)]), env).unwrap();
        let mut map = HeaderMap::new();
        headers.apply(&mut map);
        assert_eq!(map["x-api-key"], "AQE-key-from-a-mount");
        let absent = format!("${{file:{}}}", dir.path().join("absent").display());
        let error = UpstreamHeaders::compile(&table(&[("X-API-Key", &absent)]), env).unwrap_err();
        assert!(error.0.contains("absent"), "{error}");
    }
}
