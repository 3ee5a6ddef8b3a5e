//! Resource-key templates such as `invoice:{id}` or `tenant:{header:X-Tenant}:{query:doc}`:
//! parsing against the names a path pattern captures, and rendering from a request.

use http::HeaderMap;
use percent_encoding::percent_decode_str;

use super::Captures;

/// Longest resource key the gateway accepts; keeps store rows and log lines bounded.
pub const MAX_RESOURCE_KEY_LEN: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Segment(String),
    Header(http::HeaderName),
    Query(String),
}

/// A compiled resource-key template.
#[derive(Debug, Clone)]
pub struct KeyTemplate {
    parts: Vec<Part>,
}

/// What a template may read from a request.
pub struct RequestParts<'a> {
    pub captures: &'a Captures,
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("placeholder {{{0}}} names no segment of the route's path")]
    UnknownSegment(String),
    #[error("placeholder {{{0}}}: not a valid header name")]
    BadHeader(String),
    #[error(
        "placeholder {{{0}}}: unknown kind (use {{segment}}, {{header:Name}} or {{query:name}})"
    )]
    UnknownKind(String),
    #[error("unbalanced '{{' or '}}'")]
    Unbalanced,
    #[error("the template is empty")]
    Empty,
}

/// Why a key could not be rendered for one request; the client's fault, answered with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("the resource key needs header {0}, which the request does not carry once and in visible ASCII")]
    MissingHeader(String),
    #[error("the resource key needs query parameter {0:?}, which the request does not carry")]
    MissingQuery(String),
    #[error("the resource key is longer than {MAX_RESOURCE_KEY_LEN} bytes")]
    TooLong,
}

impl KeyTemplate {
    /// Parses `template`; every `{segment}` must be one of `segments`.
    pub fn parse<'a>(
        template: &str,
        mut segments: impl Iterator<Item = &'a str> + Clone,
    ) -> Result<KeyTemplate, TemplateError> {
        if template.is_empty() {
            return Err(TemplateError::Empty);
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Text(rest.to_owned()));
                    break;
                }
                Some(i) if rest.as_bytes()[i] == b'}' => return Err(TemplateError::Unbalanced),
                Some(i) => {
                    if i > 0 {
                        parts.push(Part::Text(rest[..i].to_owned()));
                    }
                    let after = &rest[i + 1..];
                    let end = after.find('}').ok_or(TemplateError::Unbalanced)?;
                    let name = &after[..end];
                    if name.contains('{') {
                        return Err(TemplateError::Unbalanced);
                    }
                    parts.push(parse_placeholder(name, &mut segments)?);
                    rest = &after[end + 1..];
                }
            }
        }
        Ok(KeyTemplate { parts })
    }

    /// Renders the key for one request.
    pub fn render(&self, request: &RequestParts<'_>) -> Result<String, RenderError> {
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => key.push_str(text),
                Part::Segment(name) => key.push_str(request.captures.get(name).unwrap_or_default()),
                Part::Header(name) => key.push_str(single_header(request.headers, name)?),
                Part::Query(name) => {
                    let value = query_value(request.query, name)
                        .ok_or_else(|| RenderError::MissingQuery(name.clone()))?;
                    key.push_str(&value);
                }
            }
            if key.len() > MAX_RESOURCE_KEY_LEN {
                return Err(RenderError::TooLong);
            }
        }
        Ok(key)
    }
}

fn parse_placeholder<'a>(
    name: &str,
    segments: &mut (impl Iterator<Item = &'a str> + Clone),
) -> Result<Part, TemplateError> {
    match name.split_once(':') {
        None => {
            if segments.clone().any(|s| s == name) {
                Ok(Part::Segment(name.to_owned()))
            } else {
                Err(TemplateError::UnknownSegment(name.to_owned()))
            }
        }
        Some(("header", header)) => http::HeaderName::from_bytes(header.as_bytes())
            .map(Part::Header)
            .map_err(|_| TemplateError::BadHeader(name.to_owned())),
        Some(("query", query)) if !query.is_empty() => Ok(Part::Query(query.to_owned())),
        Some(_) => Err(TemplateError::UnknownKind(name.to_owned())),
    }
}

fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &http::HeaderName,
) -> Result<&'h str, RenderError> {
    let mut values = headers.get_all(name).iter();
    let missing = || RenderError::MissingHeader(name.to_string());
    let value = values.next().ok_or_else(missing)?;
    if values.next().is_some() {
        return Err(missing());
    }
    let text = value.to_str().map_err(|_| missing())?.trim();
    if text.is_empty() {
        return Err(missing());
    }
    Ok(text)
}

/// The first value of `name` in an `application/x-www-form-urlencoded` query, decoded.
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (form_decode(k)? == name).then(|| form_decode(v)).flatten()
    })
}

fn form_decode(raw: &str) -> Option<String> {
    let spaced = raw.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::PathPattern;

    fn render(
        template: &str,
        path: &str,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<String, RenderError> {
        let pattern = PathPattern::parse("/t/{tenant}/invoices/{id}").unwrap();
        let captures = pattern.matches(path).unwrap();
        let t = KeyTemplate::parse(template, pattern.param_names()).unwrap();
        t.render(&RequestParts {
            captures: &captures,
            headers,
            query,
        })
    }

    #[test]
    fn renders_segments_headers_and_query() {
        let mut headers = HeaderMap::new();
        headers.insert("x-region", "eu".parse().unwrap());
        let key = render(
            "invoice:{tenant}/{id}@{header:X-Region}#{query:v}",
            "/t/acme/invoices/7",
            &headers,
            Some("a=1&v=x%20y"),
        );
        assert_eq!(key.unwrap(), "invoice:acme/7@eu#x y");
    }

    #[test]
    fn missing_inputs_are_render_errors() {
        let headers = HeaderMap::new();
        assert!(matches!(
            render("{header:X-Region}", "/t/a/invoices/1", &headers, None),
            Err(RenderError::MissingHeader(_))
        ));
        assert!(matches!(
            render("{query:v}", "/t/a/invoices/1", &headers, Some("w=1")),
            Err(RenderError::MissingQuery(_))
        ));
    }

    #[test]
    fn overlong_keys_are_refused() {
        let long = "x".repeat(MAX_RESOURCE_KEY_LEN);
        let path = format!("/t/a/invoices/{long}");
        assert_eq!(
            render("k:{id}", &path, &HeaderMap::new(), None),
            Err(RenderError::TooLong)
        );
    }

    #[test]
    fn malformed_templates_are_rejected() {
        let names = ["id"];
        let parse = |t: &str| KeyTemplate::parse(t, names.iter().copied());
        assert!(matches!(
            parse("x:{nope}"),
            Err(TemplateError::UnknownSegment(_))
        ));
        assert!(matches!(parse("x:{id"), Err(TemplateError::Unbalanced)));
        assert!(matches!(parse("x:id}"), Err(TemplateError::Unbalanced)));
        assert!(matches!(
            parse("{cookie:a}"),
            Err(TemplateError::UnknownKind(_))
        ));
        assert!(matches!(parse(""), Err(TemplateError::Empty)));
    }
}
