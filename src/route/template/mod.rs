//! Resource-key templates such as `invoice:{id}` or `tenant:{header:X-Tenant}:{query:doc:int}`:
//! parsing against the names a path pattern captures, rendering from a request (each value read
//! as its type says), and putting typed query and header inputs in their canonical form.
//! `body_input.rs`: the inputs read from a request's body (a JSON pointer, a form field).

mod body_input;

use std::borrow::Cow;

use http::{HeaderMap, HeaderValue};
use percent_encoding::percent_decode_str;

use super::{same_ignoring_case, Captures};
use crate::input_type::{InputType, ValueRefusal};

/// Longest resource key the gateway accepts; keeps store rows and log lines bounded.
pub const MAX_RESOURCE_KEY_LEN: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    /// A path segment; its type is the one the route's path declares.
    Segment(String),
    Header(http::HeaderName, InputType),
    Query(String, InputType),
    /// A string a JSON pointer names in the body.
    Json(String, InputType),
    /// A field of a form body.
    Form(String, InputType),
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
    /// The whole body, where it has been read (the idempotency layer); `None` before.
    pub body: Option<&'a [u8]>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("placeholder {{{0}}} names no segment of the route's path")]
    UnknownSegment(String),
    #[error("placeholder {{{0}}}: not a valid header name")]
    BadHeader(String),
    #[error(
        "placeholder {{{0}}}: unknown kind (use {{segment}}, {{header:Name}}, {{query:name}}, or in an idempotency key {{json:/pointer}} and {{form:name}}, each optionally typed with `:int`, `:uuid` or `:str`)"
    )]
    UnknownKind(String),
    #[error("placeholder {{{0}}}: unknown type (use `:int`, `:uuid` or `:str`)")]
    UnknownType(String),
    #[error(
        "placeholder {{{0}}}: a JSON pointer starts with '/' (RFC 6901), e.g. {{json:/payment/id}}"
    )]
    BadPointer(String),
    #[error("placeholder {{{0}}}: a path segment's type is declared in the route's path (`/orders/{{id:int}}`), so that the forwarded path is made canonical too")]
    TypedSegment(String),
    #[error("unbalanced '{{' or '}}'")]
    Unbalanced,
    #[error("the template is empty")]
    Empty,
}

/// Why a key could not be rendered for one request; the client's fault, answered with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error(
        "the resource key needs header {0}, which the request does not carry in visible ASCII"
    )]
    MissingHeader(String),
    #[error("the resource key needs header {0}, which the request carries more than once (or as a comma-separated list): upstreams differ on which value they read")]
    RepeatedHeader(String),
    #[error("the resource key needs header {0}, which is empty")]
    EmptyHeader(String),
    #[error("the resource key needs query parameter {0:?}, which the request does not carry")]
    MissingQuery(String),
    #[error("the resource key needs query parameter {0:?}, which the request carries more than once or in a form upstreams read differently (another letter case, `{0}[]`, `;` as separator, undecodable): they differ on which value they read")]
    RepeatedQuery(String),
    #[error("the resource key needs query parameter {0:?}, which is empty")]
    EmptyQuery(String),
    #[error("the resource key needs query parameter {0:?}, and the request has a form body, whose fields Go, PHP, Rack and ASP.NET read in place of (or before) the query's")]
    FormBody(String),
    #[error("the resource key is longer than {MAX_RESOURCE_KEY_LEN} bytes")]
    TooLong,
    #[error("the key's {input} {refusal}")]
    Value {
        input: String,
        refusal: ValueRefusal,
    },
    #[error("the key reads the request body, which is not read where this key is made")]
    BodyUnavailable,
    #[error("the key reads the request body as JSON, and it is not a JSON document")]
    BodyNotJson,
    #[error("the key needs the JSON string at {0:?}, which the body does not have")]
    MissingJson(String),
    #[error("the key needs a JSON string at {0:?}, and the body has another kind of value (or an empty string) there")]
    JsonNotString(String),
    #[error("the key needs form field {0:?}, and the body is not application/x-www-form-urlencoded (UTF-8)")]
    NotAForm(String),
    #[error("the key needs form field {0:?}, which the body does not carry")]
    MissingForm(String),
    #[error("the key needs form field {0:?}, which the body carries more than once or in a form upstreams read differently")]
    RepeatedForm(String),
    #[error("the key needs form field {0:?}, which is empty")]
    EmptyForm(String),
    #[error("the body already carries another value at {0:?}, where the gateway puts the idempotency key")]
    InjectConflict(String),
    #[error("the request carries an idempotency key of its own in {0}, and this route sends only the key it derives (client_key = \"refuse\")")]
    ClientKeyRefused(String),
}

impl RenderError {
    /// Whether the request does not carry an input the key needs at all (rather than carrying
    /// it in a form that is refused).
    pub fn is_missing_input(&self) -> bool {
        matches!(
            self,
            RenderError::MissingHeader(_)
                | RenderError::MissingQuery(_)
                | RenderError::MissingJson(_)
                | RenderError::MissingForm(_)
        )
    }
}

/// The template as a route's configuration would spell it.
impl std::fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for part in &self.parts {
            match part {
                Part::Text(text) => f.write_str(text)?,
                Part::Segment(name) => write!(f, "{{{name}}}")?,
                Part::Header(name, kind) => write!(f, "{{header:{name}{kind}}}")?,
                Part::Query(name, kind) => write!(f, "{{query:{name}{kind}}}")?,
                Part::Json(pointer, kind) => write!(f, "{{json:{pointer}{kind}}}")?,
                Part::Form(name, kind) => write!(f, "{{form:{name}{kind}}}")?,
            }
        }
        Ok(())
    }
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

    /// Renders the key for one request: typed values in their canonical form, untyped ones
    /// refused when frameworks would read them as a number or UUID spelled another way.
    pub fn render(&self, request: &RequestParts<'_>) -> Result<String, RenderError> {
        let mut key = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => key.push_str(text),
                Part::Segment(name) => {
                    let (value, kind) = request.captures.typed(name).unwrap_or_default();
                    // Typed segments were made canonical when the path matched.
                    key.push_str(&read_value(kind, value, || {
                        format!("path segment {{{name}}}")
                    })?);
                }
                Part::Header(name, kind) => {
                    let value = single_header(request.headers, name)?;
                    key.push_str(&read_value(*kind, value, || format!("header {name}"))?);
                }
                Part::Query(name, kind) => {
                    let value = query_input(request, name)?;
                    key.push_str(&read_value(*kind, &value, || {
                        format!("query parameter {name:?}")
                    })?);
                }
                Part::Json(pointer, kind) => {
                    let body = request.body.ok_or(RenderError::BodyUnavailable)?;
                    let value = body_input::json_string(body, pointer)?;
                    key.push_str(&read_value(*kind, &value, || {
                        format!("JSON string at {pointer:?}")
                    })?);
                }
                Part::Form(name, kind) => {
                    let body = request.body.ok_or(RenderError::BodyUnavailable)?;
                    let value = body_input::form_field(request.headers, body, name)?;
                    key.push_str(&read_value(*kind, &value, || {
                        format!("form field {name:?}")
                    })?);
                }
            }
            if key.len() > MAX_RESOURCE_KEY_LEN {
                return Err(RenderError::TooLong);
            }
        }
        Ok(key)
    }

    /// Whether the template reads the request body (`{json:..}`, `{form:..}`).
    pub fn reads_body(&self) -> bool {
        self.parts
            .iter()
            .any(|part| matches!(part, Part::Json(..) | Part::Form(..)))
    }

    /// Whether the template reads a typed query parameter or header, which
    /// [`canonicalize_inputs`](Self::canonicalize_inputs) may rewrite.
    pub fn has_typed_inputs(&self) -> bool {
        self.parts.iter().any(
            |part| matches!(part, Part::Header(_, kind) | Part::Query(_, kind) if kind.has_canonical_form()),
        )
    }

    /// The placeholders that carry no type, as the template spells them (`{id}`,
    /// `{header:X-Tenant}`); `segment_type` gives a path segment's declared type.
    pub fn untyped_placeholders(&self, segment_type: impl Fn(&str) -> InputType) -> Vec<String> {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::Segment(name) if segment_type(name) == InputType::Untyped => {
                    Some(format!("{{{name}}}"))
                }
                Part::Header(name, InputType::Untyped) => Some(format!("{{header:{name}}}")),
                Part::Query(name, InputType::Untyped) => Some(format!("{{query:{name}}}")),
                Part::Json(pointer, InputType::Untyped) => Some(format!("{{json:{pointer}}}")),
                Part::Form(name, InputType::Untyped) => Some(format!("{{form:{name}}}")),
                _ => None,
            })
            .collect()
    }

    /// Puts each typed query parameter and header this template reads in the canonical form it
    /// is keyed by, so that the upstream reads the value that was keyed: headers in place, the
    /// query returned when it changed. An input that cannot be read is left as it is (rendering
    /// the key refuses it).
    pub fn canonicalize_inputs(
        &self,
        headers: &mut HeaderMap,
        query: Option<&str>,
    ) -> Option<String> {
        let mut rewritten: Option<String> = None;
        for part in &self.parts {
            match part {
                Part::Header(name, kind) if kind.has_canonical_form() => {
                    let Ok(value) = single_header(headers, name) else {
                        continue;
                    };
                    if let Ok(Cow::Owned(canonical)) = kind.read(value) {
                        if let Ok(canonical) = HeaderValue::from_str(&canonical) {
                            headers.insert(name.clone(), canonical);
                        }
                    }
                }
                Part::Query(name, kind) if kind.has_canonical_form() => {
                    let current = rewritten.as_deref().or(query);
                    let Ok(pair) = single_query_pair(current, name) else {
                        continue;
                    };
                    let Some(value) = form_decode(pair_value(pair)) else {
                        continue;
                    };
                    if let Ok(Cow::Owned(canonical)) = kind.read(&value) {
                        let raw_name = pair.split_once('=').map_or(pair, |(n, _)| n);
                        let replaced = format!("{raw_name}={canonical}");
                        let whole = current.unwrap_or_default();
                        let query = whole
                            .split('&')
                            .map(|piece| {
                                if piece == pair {
                                    replaced.as_str()
                                } else {
                                    piece
                                }
                            })
                            .collect::<Vec<_>>()
                            .join("&");
                        rewritten = Some(query);
                    }
                }
                _ => {}
            }
        }
        rewritten
    }
}

/// `value` read as `kind` says; `input` names it for the refusal.
fn read_value<'v>(
    kind: InputType,
    value: &'v str,
    input: impl FnOnce() -> String,
) -> Result<Cow<'v, str>, RenderError> {
    kind.read(value).map_err(|refusal| RenderError::Value {
        input: input(),
        refusal,
    })
}

/// The one value of query parameter `name`, refused when the body is a form (its fields are
/// read in place of the query's by some upstreams).
fn query_input(request: &RequestParts<'_>, name: &str) -> Result<String, RenderError> {
    if has_form_body(request.headers) {
        return Err(RenderError::FormBody(name.to_owned()));
    }
    single_query_value(request.query, name)
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
        Some(("header", header)) => {
            let (header, kind) = InputType::split_suffix(header);
            http::HeaderName::from_bytes(header.as_bytes())
                .map(|header| Part::Header(header, kind))
                .map_err(|_| TemplateError::BadHeader(name.to_owned()))
        }
        Some(("query", query)) => {
            let (query, kind) = typed_name(name, query)?;
            Ok(Part::Query(query.to_owned(), kind))
        }
        Some(("form", field)) => {
            let (field, kind) = typed_name(name, field)?;
            Ok(Part::Form(field.to_owned(), kind))
        }
        Some(("json", pointer)) => {
            // A pointer may hold ':' itself: only a known type after the last one is a type.
            let (pointer, kind) = InputType::split_suffix(pointer);
            if !pointer.starts_with('/') {
                return Err(TemplateError::BadPointer(name.to_owned()));
            }
            Ok(Part::Json(pointer.to_owned(), kind))
        }
        Some((segment, suffix))
            if InputType::from_suffix(suffix).is_some()
                && segments.clone().any(|s| s == segment) =>
        {
            Err(TemplateError::TypedSegment(name.to_owned()))
        }
        Some(_) => Err(TemplateError::UnknownKind(name.to_owned())),
    }
}

/// A query or form name with its optional type (`id:int`); an unknown type is an error.
fn typed_name<'n>(placeholder: &str, text: &'n str) -> Result<(&'n str, InputType), TemplateError> {
    let (name, kind) = match text.rsplit_once(':') {
        Some((name, suffix)) => match InputType::from_suffix(suffix) {
            Some(kind) => (name, kind),
            None => return Err(TemplateError::UnknownType(placeholder.to_owned())),
        },
        None => (text, InputType::Untyped),
    };
    if name.is_empty() {
        return Err(TemplateError::UnknownKind(placeholder.to_owned()));
    }
    Ok((name, kind))
}

/// The one value of field `name` in a form body, read as strictly as a query parameter.
pub(super) fn form_body_field(body: &str, name: &str) -> Result<String, RenderError> {
    single_query_value(Some(body), name).map_err(|error| match error {
        RenderError::MissingQuery(name) => RenderError::MissingForm(name),
        RenderError::EmptyQuery(name) => RenderError::EmptyForm(name),
        _ => RenderError::RepeatedForm(name.to_owned()),
    })
}

/// The one value of header `name`: present once, not a comma list, not empty, visible ASCII.
fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &http::HeaderName,
) -> Result<&'h str, RenderError> {
    let mut values = headers.get_all(name).iter();
    let value = values
        .next()
        .ok_or_else(|| RenderError::MissingHeader(name.to_string()))?;
    if values.next().is_some() || has_underscore_twin(headers, name) {
        return Err(RenderError::RepeatedHeader(name.to_string()));
    }
    let text = value
        .to_str()
        .map_err(|_| RenderError::MissingHeader(name.to_string()))?
        .trim();
    if text.is_empty() {
        return Err(RenderError::EmptyHeader(name.to_string()));
    }
    // Frameworks join a repeated header's values with ", ": a list is a repeat in disguise.
    if text.contains(',') {
        return Err(RenderError::RepeatedHeader(name.to_string()));
    }
    Ok(text)
}

/// Whether the request also carries `name` spelled with '_' for '-' (`X_Tenant` for
/// `X-Tenant`): CGI-style servers turn both into `HTTP_X_TENANT`, and some let the later one win.
fn has_underscore_twin(headers: &HeaderMap, name: &http::HeaderName) -> bool {
    let wanted = name.as_str().replace('-', "_");
    headers
        .keys()
        .any(|other| other != name && other.as_str().replace('-', "_") == wanted)
}

/// The one value of `name` in an `application/x-www-form-urlencoded` query, decoded, read so that
/// every upstream reads the same: Flask and Go take the first of repeated parameters, PHP and
/// Rack the last, Spring joins them, Express makes an array of them and of `name[]`, ASP.NET
/// compares names without case, and older parsers split on `;` too. So any second parameter
/// that one of them would read as `name` is a repeat, and the value must be the same whether `;`
/// separates or not.
fn single_query_value(query: Option<&str>, name: &str) -> Result<String, RenderError> {
    let pair = single_query_pair(query, name)?;
    let value =
        form_decode(pair_value(pair)).ok_or_else(|| RenderError::RepeatedQuery(name.to_owned()))?;
    if value.is_empty() {
        return Err(RenderError::EmptyQuery(name.to_owned()));
    }
    Ok(value)
}

/// The one `name=value` pair of the query that every upstream reads as `name` (see
/// [`single_query_value`]), as sent.
fn single_query_pair<'q>(query: Option<&'q str>, name: &str) -> Result<&'q str, RenderError> {
    let repeated = || RenderError::RepeatedQuery(name.to_owned());
    let mut found: Option<&str> = None;
    for pair in query.unwrap_or("").split(['&', ';']) {
        let raw_name = pair.split_once('=').map_or(pair, |(n, _)| n);
        let Some(decoded) = form_decode(raw_name) else {
            continue;
        };
        if !reads_as(&decoded, name) {
            continue;
        }
        if decoded != name || found.is_some() {
            return Err(repeated());
        }
        found = Some(pair);
    }
    let pair = found.ok_or_else(|| RenderError::MissingQuery(name.to_owned()))?;
    // Split on '&' alone, the same parameter must end where it ended above.
    if query.unwrap_or("").split('&').all(|whole| whole != pair) {
        return Err(repeated());
    }
    Ok(pair)
}

/// The raw value of a `name=value` pair (empty without `=`).
fn pair_value(pair: &str) -> &str {
    pair.split_once('=').map_or("", |(_, v)| v)
}

/// Whether some upstream reads a parameter called `candidate` (decoded) as `name`: the same name
/// in any letter case (ASP.NET, also with Unicode case mappings), and the way PHP, Rack and qs
/// mangle names: cut at a NUL, leading spaces dropped, `.` and ' ' (and an unclosed `[`) read as
/// '_', brackets around or after the name (`[id]`, `id]`, `id[]`, `id[x]`) dropped.
fn reads_as(candidate: &str, name: &str) -> bool {
    same_ignoring_case(&mangled(candidate), &mangled(name))
}

fn mangled(name: &str) -> String {
    let name = name.split('\0').next().unwrap_or_default();
    let name = name.trim_start_matches([' ', '[', ']']);
    let name = match name.find('[') {
        Some(open) if name[open..].contains(']') => &name[..open],
        _ => name,
    };
    name.trim_end_matches(']')
        .chars()
        .map(|c| if matches!(c, '.' | ' ' | '[') { '_' } else { c })
        .collect()
}

/// Whether the request's body is a form (`application/x-www-form-urlencoded`,
/// `multipart/form-data`), or may be: a `Content-Type` that is not one visible-ASCII field.
fn has_form_body(headers: &HeaderMap) -> bool {
    let mut types = headers.get_all(http::header::CONTENT_TYPE).iter();
    let Some(first) = types.next() else {
        return false;
    };
    let Ok(text) = first.to_str() else {
        return true;
    };
    let essence = media_type(text);
    types.next().is_some()
        || essence.eq_ignore_ascii_case("application/x-www-form-urlencoded")
        || essence.eq_ignore_ascii_case("multipart/form-data")
}

/// The media type of a `Content-Type` value, without its parameters (`text/plain; charset=x` is
/// `text/plain`).
pub(super) fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or_default().trim()
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
        let canonical = crate::route::canonicalize(path).unwrap();
        let captures = pattern
            .match_path(&canonical, false)
            .unwrap()
            .unwrap()
            .captures;
        let t = KeyTemplate::parse(template, pattern.param_names()).unwrap();
        t.render(&RequestParts {
            captures: &captures,
            headers,
            query,
            body: None,
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
    fn key_inputs_that_upstreams_could_read_differently_are_refused() {
        let path = "/t/a/invoices/1";
        let none = HeaderMap::new();
        let query = |q: &str| render("{query:id}", path, &none, Some(q));
        assert_eq!(query("id=7").unwrap(), "7");
        assert_eq!(query("x=1&id=a+b%21").unwrap(), "a b!");
        assert_eq!(query("i%64=7").unwrap(), "7");
        for q in [
            "id=7&id=42",
            "id=7;id=42",
            "id=7&i%64=42",
            "id=7&ID=42",
            "id=7&id[]=42",
            "id[]=7",
            "id[a]=7",
            "ID=7",
            "id=7;x=1",
            "x=1;id=7",
            "id=%ff",
        ] {
            assert_eq!(
                query(q),
                Err(RenderError::RepeatedQuery("id".into())),
                "{q}"
            );
        }
        for q in ["id=", "id", "x=1&id=&y=2"] {
            assert_eq!(query(q), Err(RenderError::EmptyQuery("id".into())), "{q}");
        }
        assert_eq!(query("x=7"), Err(RenderError::MissingQuery("id".into())));
        let snake = render("{query:a_b}", path, &none, Some("a.b=1&a_b=2"));
        assert_eq!(snake, Err(RenderError::RepeatedQuery("a_b".into())));
        for q in [
            "id=7&+id=5",
            "id=7&id%00=5",
            "id=7&[id]=5",
            "id=7&id]=5",
            "id=7&%C4%B1d=5",
        ] {
            assert_eq!(
                query(q),
                Err(RenderError::RepeatedQuery("id".into())),
                "{q}"
            );
        }
        let unclosed = render("{query:a_b}", path, &none, Some("a_b=7&a[b=5"));
        assert_eq!(unclosed, Err(RenderError::RepeatedQuery("a_b".into())));
        let mut form = HeaderMap::new();
        form.insert(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8"
                .parse()
                .unwrap(),
        );
        assert_eq!(
            render("{query:id}", path, &form, Some("id=7")),
            Err(RenderError::FormBody("id".into()))
        );
        form.insert("content-type", "application/json".parse().unwrap());
        assert_eq!(
            render("{query:id}", path, &form, Some("id=7")).unwrap(),
            "7"
        );

        let header = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append("x-tenant", v.parse().unwrap());
            }
            render("{header:X-Tenant}", path, &headers, None)
        };
        assert_eq!(header(&["acme"]).unwrap(), "acme");
        assert!(matches!(
            header(&["a", "b"]),
            Err(RenderError::RepeatedHeader(_))
        ));
        assert!(matches!(
            header(&["a, b"]),
            Err(RenderError::RepeatedHeader(_))
        ));
        assert!(matches!(header(&[""]), Err(RenderError::EmptyHeader(_))));
        assert!(matches!(header(&["  "]), Err(RenderError::EmptyHeader(_))));
        let mut twins = HeaderMap::new();
        twins.insert("x-tenant", "acme".parse().unwrap());
        twins.insert("x_tenant", "evil".parse().unwrap());
        assert!(matches!(
            render("{header:X-Tenant}", path, &twins, None),
            Err(RenderError::RepeatedHeader(_))
        ));
    }

    #[test]
    fn typed_inputs_are_keyed_canonical_and_untyped_lookalikes_refused() {
        let path = "/t/a/invoices/1";
        let none = HeaderMap::new();
        assert_eq!(
            render("k:{query:id:int}", path, &none, Some("id=007")).unwrap(),
            "k:7"
        );
        assert_eq!(
            render(
                "k:{query:id:uuid}",
                path,
                &none,
                Some("id=%7BA0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11%7D")
            )
            .unwrap(),
            "k:a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
        );
        assert!(matches!(
            render("k:{query:id:int}", path, &none, Some("id=%2B7")),
            Err(RenderError::Value {
                refusal: ValueRefusal::NotInt,
                ..
            })
        ));
        assert_eq!(
            render("k:{query:id:str}", path, &none, Some("id=007")).unwrap(),
            "k:007"
        );
        for (query, refusal) in [
            ("id=007", ValueRefusal::NumberSpelling),
            ("id=+7", ValueRefusal::Spacing),
            (
                "id=A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
                ValueRefusal::UuidSpelling,
            ),
        ] {
            assert_eq!(
                render("k:{query:id}", path, &none, Some(query)),
                Err(RenderError::Value {
                    input: "query parameter \"id\"".into(),
                    refusal
                }),
                "{query}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.insert("x-shipment", "0042".parse().unwrap());
        assert_eq!(
            render("s:{header:X-Shipment:int}", path, &headers, None).unwrap(),
            "s:42"
        );
        assert!(matches!(
            render("s:{header:X-Shipment}", path, &headers, None),
            Err(RenderError::Value { .. })
        ));
        // An untyped path segment is held to the same rule.
        assert!(matches!(
            render("k:{id}", "/t/a/invoices/042", &none, None),
            Err(RenderError::Value { .. })
        ));
        assert_eq!(
            render("k:{id}", "/t/a/invoices/42", &none, None).unwrap(),
            "k:42"
        );
    }

    #[test]
    fn typed_query_and_header_inputs_are_forwarded_canonical() {
        let names = ["id"];
        let t = KeyTemplate::parse(
            "k:{query:id:int}:{header:X-Crate:uuid}:{query:v}",
            names.iter().copied(),
        )
        .unwrap();
        assert!(t.has_typed_inputs());
        assert_eq!(
            t.to_string(),
            "k:{query:id:int}:{header:x-crate:uuid}:{query:v}"
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-crate",
            "A0EEBC999C0B4EF8BB6D6BB9BD380A11".parse().unwrap(),
        );
        let query = t.canonicalize_inputs(&mut headers, Some("v=007&id=007&w=1"));
        assert_eq!(query.as_deref(), Some("v=007&id=7&w=1"));
        assert_eq!(
            headers.get("x-crate").unwrap(),
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
        );
        // Canonical already, or unreadable: nothing changes (rendering refuses the latter).
        assert_eq!(t.canonicalize_inputs(&mut headers, Some("id=7")), None);
        assert_eq!(t.canonicalize_inputs(&mut headers, Some("id=7&id=8")), None);
        let untyped = KeyTemplate::parse("k:{query:id}", names.iter().copied()).unwrap();
        assert!(!untyped.has_typed_inputs());
        assert_eq!(
            untyped.untyped_placeholders(|_| InputType::Untyped),
            vec!["{query:id}".to_owned()]
        );
        assert_eq!(
            t.untyped_placeholders(|_| InputType::Untyped),
            vec!["{query:v}".to_owned()]
        );
        assert!(matches!(
            KeyTemplate::parse("k:{id:int}", names.iter().copied()),
            Err(TemplateError::TypedSegment(_))
        ));
        assert!(matches!(
            KeyTemplate::parse("k:{query:id:integer}", names.iter().copied()),
            Err(TemplateError::UnknownType(_))
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
