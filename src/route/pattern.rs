//! Path patterns such as `/invoices/{id:int}/send` or `/files/{*rest}`: parsing and matching,
//! typed segments made canonical in the captures and in the path that is forwarded.

use std::borrow::Cow;

use percent_encoding::percent_decode_str;

use super::canonical::canonical_literal;
use super::fold::same_ignoring_case;
use super::{CanonicalPath, PathRefusal, MAX_CAPTURE_LEN};
use crate::input_type::InputType;

/// One segment of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(Literal),
    /// `{name}` or `{name:type}`: exactly one non-empty segment.
    Param(String, InputType),
    /// `{*name}`: the non-empty remainder of the path, slashes included; last only.
    Rest(String),
}

/// A literal segment: its canonical text (what is forwarded) and that text decoded (what is
/// compared: upstreams decode `%3A` before routing, so `invoices%3Abatch` is `invoices:batch`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Literal {
    text: String,
    decoded: String,
    /// ASCII without escapes: then only an ASCII request segment without escapes can match.
    plain: bool,
}

impl Literal {
    fn new(text: String) -> Literal {
        let decoded = percent_decode_str(&text).decode_utf8_lossy().into_owned();
        let plain = is_plain(&text);
        Literal {
            text,
            decoded,
            plain,
        }
    }

    /// Whether a canonical request segment names this literal.
    fn matches(&self, part: &str, case_sensitive: bool) -> bool {
        let same = if case_sensitive {
            part == self.text
        } else {
            part.eq_ignore_ascii_case(&self.text)
        };
        if same || (self.plain && is_plain(part)) {
            return same;
        }
        let Ok(decoded) = percent_decode_str(part).decode_utf8() else {
            return false;
        };
        if case_sensitive {
            decoded == self.decoded
        } else {
            same_ignoring_case(&decoded, &self.decoded)
        }
    }
}

/// ASCII without escapes: compares as it is spelled.
fn is_plain(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii() && b != b'%')
}

/// A compiled path pattern.
#[derive(Debug, Clone)]
pub struct PathPattern {
    segments: Vec<Segment>,
}

/// One value a match captured: decoded, and canonical when its segment is typed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Capture {
    name: String,
    value: String,
    kind: InputType,
}

/// The decoded values a match captured, in pattern order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captures(Vec<Capture>);

impl Captures {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.typed(name).map(|(value, _)| value)
    }

    /// A capture's value and the type its segment declares.
    pub fn typed(&self, name: &str) -> Option<(&str, InputType)> {
        self.0
            .iter()
            .find(|c| c.name == name)
            .map(|c| (c.value.as_str(), c.kind))
    }

    /// These captures plus `extra` values, plain strings (path segments win over extras of the
    /// same name).
    pub fn with(&self, extra: &[(&str, &str)]) -> Captures {
        let mut all = self.0.clone();
        all.extend(extra.iter().map(|(n, v)| Capture {
            name: (*n).to_owned(),
            value: (*v).to_owned(),
            kind: InputType::Str,
        }));
        Captures(all)
    }
}

/// A pattern's match of one path: what it captured, and the path to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathMatch {
    pub captures: Captures,
    /// The canonical path with the pattern's literals spelled as the pattern spells them (they
    /// may have matched in another letter case), so the upstream reads the resource that was
    /// keyed.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("must start with '/'")]
    NoLeadingSlash,
    #[error("segment {0:?}: a parameter must be a whole segment, `{{name}}` or `{{*name}}`")]
    PartialParam(String),
    #[error("parameter name {0:?} must be letters, digits or '_'")]
    BadName(String),
    #[error("parameter {0:?} appears twice")]
    DuplicateName(String),
    #[error("`{{*{0}}}` must be the last segment")]
    RestNotLast(String),
    #[error("segment {0:?} could never match a request path (empty, a dot segment, `;`, an encoded separator or a malformed escape)")]
    NeverMatches(String),
    #[error("parameter {0:?}: unknown type (use `:int`, `:uuid` or `:str`)")]
    UnknownType(String),
    #[error("`{{*{0}}}` takes the rest of the path and cannot be typed")]
    TypedRest(String),
}

/// The pattern in its canonical spelling (`/invoices/{id}`, `/files/{*path}`).
impl std::fmt::Display for PathPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for segment in &self.segments {
            match segment {
                Segment::Literal(literal) => write!(f, "/{}", literal.text)?,
                Segment::Param(name, kind) => write!(f, "/{{{name}{kind}}}")?,
                Segment::Rest(name) => write!(f, "/{{*{name}}}")?,
            }
        }
        if self.segments.is_empty() {
            f.write_str("/")?;
        }
        Ok(())
    }
}

impl PathPattern {
    /// Parses a pattern. Its literals are made canonical as request paths are, and a trailing
    /// slash is dropped (a request's trailing slash is ignored when matching).
    pub fn parse(pattern: &str) -> Result<PathPattern, PatternError> {
        let body = pattern
            .strip_prefix('/')
            .ok_or(PatternError::NoLeadingSlash)?;
        let body = if body.is_empty() {
            body
        } else {
            body.strip_suffix('/').unwrap_or(body)
        };
        let raw: Vec<&str> = body.split('/').collect();
        let mut segments = Vec::with_capacity(raw.len());
        for (i, part) in raw.iter().enumerate() {
            let segment = parse_segment(part, raw.len() == 1)?;
            if let Segment::Rest(name) = &segment {
                if i + 1 != raw.len() {
                    return Err(PatternError::RestNotLast(name.clone()));
                }
            }
            if let Segment::Param(name, _) | Segment::Rest(name) = &segment {
                if segments
                    .iter()
                    .any(|s| matches!(s, Segment::Param(n, _) | Segment::Rest(n) if n == name))
                {
                    return Err(PatternError::DuplicateName(name.clone()));
                }
            }
            segments.push(segment);
        }
        Ok(PathPattern { segments })
    }

    /// Names this pattern captures.
    pub fn param_names(&self) -> impl Iterator<Item = &str> + Clone {
        self.params().map(|(name, _)| name)
    }

    /// Names this pattern captures, with the type each declares (a `{*rest}` is a plain string).
    pub fn params(&self) -> impl Iterator<Item = (&str, InputType)> + Clone {
        self.segments.iter().filter_map(|s| match s {
            Segment::Param(n, kind) => Some((n.as_str(), *kind)),
            Segment::Rest(n) => Some((n.as_str(), InputType::Str)),
            Segment::Literal(_) => None,
        })
    }

    /// The type parameter `name` declares, if the pattern has it.
    pub fn param_type(&self, name: &str) -> Option<InputType> {
        self.params()
            .find(|(n, _)| *n == name)
            .map(|(_, kind)| kind)
    }

    /// The literal prefix before the first parameter (used to keep routes out of reserved space).
    pub fn literal_prefix(&self) -> String {
        let mut prefix = String::from("/");
        for segment in &self.segments {
            match segment {
                Segment::Literal(literal) => {
                    prefix.push_str(&literal.text);
                    prefix.push('/');
                }
                _ => break,
            }
        }
        prefix
    }

    /// Whether this pattern matches every path `other` matches (so a route with `other` listed
    /// after it would never be used): a parameter covers any one segment, a rest parameter any
    /// remainder, and a literal the same literal (without case unless `case_sensitive`).
    pub fn covers(&self, other: &PathPattern, case_sensitive: bool) -> bool {
        for (i, mine) in self.segments.iter().enumerate() {
            let Some(theirs) = other.segments.get(i) else {
                return false;
            };
            match (mine, theirs) {
                (Segment::Rest(_), _) => return true,
                (Segment::Param(..), Segment::Literal(l)) => {
                    if l.text.is_empty() {
                        return false;
                    }
                }
                // A typed parameter refuses what is not of its type rather than letting a later
                // route have it, so it covers any parameter.
                (Segment::Param(..), Segment::Param(..)) => {}
                (Segment::Literal(a), Segment::Literal(b)) => {
                    let same = if case_sensitive {
                        a.decoded == b.decoded
                    } else {
                        same_ignoring_case(&a.decoded, &b.decoded)
                    };
                    if !same {
                        return false;
                    }
                }
                _ => return false,
            }
        }
        self.segments.len() == other.segments.len()
    }

    /// Whether `segments` have this pattern's shape: its literals, a non-empty segment for each
    /// parameter, and a non-empty remainder for a rest parameter.
    fn has_shape_of(&self, segments: &[&str], case_sensitive: bool) -> bool {
        for (i, segment) in self.segments.iter().enumerate() {
            let Some(part) = segments.get(i) else {
                return false;
            };
            let fits = match segment {
                Segment::Literal(literal) => literal.matches(part, case_sensitive),
                Segment::Param(..) => !part.is_empty(),
                Segment::Rest(_) => return segments[i..].iter().any(|p| !p.is_empty()),
            };
            if !fits {
                return false;
            }
        }
        segments.len() == self.segments.len()
    }

    /// Whether the pattern ends in `{*name}`, whose matches may be collections of other matches.
    pub fn ends_in_rest(&self) -> bool {
        matches!(self.segments.last(), Some(Segment::Rest(_)))
    }

    /// Whether `path` is a proper ancestor of paths this pattern matches (`/files/ledger/` of
    /// `/files/ledger/{name}`, and `/` of every pattern): a collection whose recursive DELETE, MOVE
    /// or COPY would reach them.
    pub fn has_descendants(&self, path: &CanonicalPath, case_sensitive: bool) -> bool {
        let parts: Vec<&str> = path.segments().filter(|p| !p.is_empty()).collect();
        if parts.len() >= self.segments.len() {
            return false;
        }
        self.segments
            .iter()
            .zip(&parts)
            .all(|(segment, part)| match segment {
                Segment::Literal(literal) => literal.matches(part, case_sensitive),
                Segment::Param(..) | Segment::Rest(_) => true,
            })
    }

    /// Matches a canonical path; captured values are decoded, and typed ones made canonical in
    /// the captures and in the path to forward. Literals compare ASCII-case-insensitively unless
    /// `case_sensitive`. A path with this pattern's shape whose capture is oversized, not UTF-8
    /// once decoded, or not of its segment's type is `Err`: the request was meant for this route
    /// and is malformed, rather than meant for another route.
    pub fn match_path(
        &self,
        path: &CanonicalPath,
        case_sensitive: bool,
    ) -> Result<Option<PathMatch>, PathRefusal> {
        let parts: Vec<&str> = path.segments().collect();
        self.match_segments(&parts, path.has_trailing_slash(), case_sensitive)
    }

    /// [`match_path`](Self::match_path) on a path already split into its segments (the trailing
    /// slash dropped, and said by `trailing_slash`), so that a table splits a path once.
    pub fn match_segments(
        &self,
        segments: &[&str],
        trailing_slash: bool,
        case_sensitive: bool,
    ) -> Result<Option<PathMatch>, PathRefusal> {
        // Whether the shape matches, before anything is built: most routes a path is tried
        // against miss at once.
        if !self.has_shape_of(segments, case_sensitive) {
            return Ok(None);
        }
        let size = segments.iter().map(|p| p.len() + 1).sum::<usize>() + 1;
        let mut forward = String::with_capacity(size);
        let mut captures = Vec::new();
        let mut refusal = None;
        for (i, segment) in self.segments.iter().enumerate() {
            forward.push('/');
            let (name, raw, limit, kind) = match segment {
                Segment::Literal(literal) => {
                    forward.push_str(&literal.text);
                    continue;
                }
                Segment::Param(name, kind) => {
                    (name, Cow::Borrowed(segments[i]), MAX_CAPTURE_LEN, *kind)
                }
                Segment::Rest(name) => (
                    name,
                    Cow::Owned(segments[i..].join("/")),
                    usize::MAX,
                    InputType::Str,
                ),
            };
            match check_capture(name, &raw, limit, kind) {
                Ok(value) => {
                    // A typed value is forwarded in the canonical form it is keyed by.
                    let canonical = kind.has_canonical_form();
                    forward.push_str(if canonical { &value } else { &raw });
                    captures.push(Capture {
                        name: name.clone(),
                        value,
                        kind,
                    });
                }
                Err(why) => {
                    refusal.get_or_insert(why);
                }
            }
            if matches!(segment, Segment::Rest(_)) {
                break;
            }
        }
        if trailing_slash {
            forward.push('/');
        }
        match refusal {
            Some(why) => Err(why),
            None => Ok(Some(PathMatch {
                captures: Captures(captures),
                path: forward,
            })),
        }
    }
}

fn parse_segment(part: &str, only: bool) -> Result<Segment, PatternError> {
    if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
        let (inner, rest) = match inner.strip_prefix('*') {
            Some(name) => (name, true),
            None => (inner, false),
        };
        let (name, kind) = match inner.split_once(':') {
            Some((name, suffix)) => {
                let kind = InputType::from_suffix(suffix)
                    .ok_or_else(|| PatternError::UnknownType(inner.to_owned()))?;
                (name, kind)
            }
            None => (inner, InputType::Untyped),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(PatternError::BadName(name.to_owned()));
        }
        return match (rest, kind) {
            (true, InputType::Untyped) => Ok(Segment::Rest(name.to_owned())),
            (true, _) => Err(PatternError::TypedRest(name.to_owned())),
            (false, kind) => Ok(Segment::Param(name.to_owned(), kind)),
        };
    }
    if part.contains('{') || part.contains('}') {
        return Err(PatternError::PartialParam(part.to_owned()));
    }
    // The root pattern `/` is one empty literal; nowhere else can a segment be empty.
    if part.is_empty() && only {
        return Ok(Segment::Literal(Literal::new(String::new())));
    }
    match canonical_literal(part) {
        Some(text) if !text.is_empty() => Ok(Segment::Literal(Literal::new(text))),
        _ => Err(PatternError::NeverMatches(part.to_owned())),
    }
}

/// A captured segment decoded, and made canonical when it is typed; or why it cannot be one.
fn check_capture(
    name: &str,
    raw: &str,
    limit: usize,
    kind: InputType,
) -> Result<String, PathRefusal> {
    if raw.len() > limit {
        return Err(PathRefusal::SegmentTooLong);
    }
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| PathRefusal::NotUtf8)?;
    // An untyped value is checked only where a key reads it, on a method the route guards.
    if !kind.has_canonical_form() {
        return Ok(decoded.into_owned());
    }
    match kind.read(&decoded) {
        Ok(canonical) => Ok(canonical.into_owned()),
        Err(refusal) => Err(PathRefusal::NotOfType {
            name: name.to_owned(),
            refusal,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::canonicalize;

    fn matches(pattern: &PathPattern, raw: &str) -> Option<PathMatch> {
        pattern
            .match_path(&canonicalize(raw).unwrap(), false)
            .ok()
            .flatten()
    }

    #[test]
    fn named_segment_matches_one_segment() {
        let p = PathPattern::parse("/invoices/{id}").unwrap();
        assert_eq!(
            matches(&p, "/invoices/72").unwrap().captures.get("id"),
            Some("72")
        );
        assert!(matches(&p, "/invoices/72/send").is_none());
        assert!(matches(&p, "/invoices/").is_none());
        assert!(matches(&p, "/invoices").is_none());
        assert!(matches(&p, "/other/72").is_none());
    }

    #[test]
    fn trailing_slash_and_letter_case_match_the_same_route() {
        let p = PathPattern::parse("/invoices/{id}").unwrap();
        for raw in [
            "/invoices/1/",
            "/Invoices/1",
            "/INVOICES/1/",
            "//invoices//1",
        ] {
            let found = matches(&p, raw).unwrap();
            assert_eq!(found.captures.get("id"), Some("1"), "{raw}");
        }
        assert_eq!(matches(&p, "/INVOICES/Ab/").unwrap().path, "/invoices/Ab/");
        assert_eq!(matches(&p, "/Invoices/Ab").unwrap().path, "/invoices/Ab");
        let exact = canonicalize("/Invoices/1").unwrap();
        assert_eq!(p.match_path(&exact, true), Ok(None));
        // A pattern's own trailing slash is dropped too.
        let slash = PathPattern::parse("/invoices/").unwrap();
        assert!(matches(&slash, "/invoices").is_some());
        assert!(matches(&slash, "/invoices/").is_some());
    }

    #[test]
    fn captures_are_percent_decoded() {
        let p = PathPattern::parse("/invoices/{id}").unwrap();
        assert_eq!(
            matches(&p, "/invoices/%37%32").unwrap().captures.get("id"),
            Some("72")
        );
        assert_eq!(
            matches(&p, "/invoices/a%20b").unwrap().captures.get("id"),
            Some("a b")
        );
    }

    #[test]
    fn malformed_captures_are_refusals_not_misses() {
        let p = PathPattern::parse("/invoices/{id}/send").unwrap();
        let path = |raw: &str| canonicalize(raw).unwrap();
        assert_eq!(
            p.match_path(&path("/invoices/%ff/send"), false),
            Err(PathRefusal::NotUtf8)
        );
        let long = format!("/invoices/{}/send", "x".repeat(MAX_CAPTURE_LEN + 1));
        assert_eq!(
            p.match_path(&path(&long), false),
            Err(PathRefusal::SegmentTooLong)
        );
        // Another shape is a miss, whatever its captures look like.
        assert_eq!(p.match_path(&path("/other/%ff/send"), false), Ok(None));
    }

    #[test]
    fn typed_segments_are_captured_and_forwarded_canonical() {
        let p = PathPattern::parse("/orders/{id:int}/lines/{line:uuid}").unwrap();
        assert_eq!(p.to_string(), "/orders/{id:int}/lines/{line:uuid}");
        let found = matches(
            &p,
            "/Orders/0042/lines/%7BA0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11%7D/",
        )
        .unwrap();
        assert_eq!(found.captures.get("id"), Some("42"));
        assert_eq!(
            found.captures.typed("line"),
            Some(("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", InputType::Uuid))
        );
        assert_eq!(
            found.path,
            "/orders/42/lines/a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11/"
        );
        // A value not of its type is the route's refusal, not another route's match.
        for bad in [
            "/orders/+42/lines/x",
            "/orders/4%202/lines/x",
            "/orders/42/lines/1-2-3-4-5",
        ] {
            let path = canonicalize(bad).unwrap();
            assert!(
                matches!(
                    p.match_path(&path, false),
                    Err(PathRefusal::NotOfType { .. })
                ),
                "{bad}"
            );
        }
        // Untyped and `:str` segments are kept as sent.
        let s = PathPattern::parse("/a/{x:str}/{y}").unwrap();
        let found = matches(&s, "/a/042/%2B42").unwrap();
        assert_eq!(found.path, "/a/042/%2B42");
        assert_eq!(found.captures.typed("x"), Some(("042", InputType::Str)));
        assert_eq!(found.captures.typed("y"), Some(("+42", InputType::Untyped)));
        assert!(matches!(
            PathPattern::parse("/a/{x:float}"),
            Err(PatternError::UnknownType(_))
        ));
        assert!(matches!(
            PathPattern::parse("/a/{*x:int}"),
            Err(PatternError::TypedRest(_))
        ));
        // A typed parameter covers any later parameter: it refuses what is not of its type.
        assert!(p.covers(
            &PathPattern::parse("/orders/{slug}/lines/{l}").unwrap(),
            false
        ));
    }

    #[test]
    fn rest_takes_the_remainder() {
        let p = PathPattern::parse("/files/{*rest}").unwrap();
        let found = matches(&p, "/files/a/b/c/").unwrap();
        assert_eq!(found.captures.get("rest"), Some("a/b/c"));
        assert_eq!(found.path, "/files/a/b/c/");
        assert!(matches(&p, "/files/").is_none());
        assert!(matches(&p, "/files").is_none());
    }

    #[test]
    fn literal_and_params_mix() {
        let p = PathPattern::parse("/t/{tenant}/invoices/{id}/send").unwrap();
        let c = matches(&p, "/t/acme/invoices/9/send").unwrap().captures;
        assert_eq!((c.get("tenant"), c.get("id")), (Some("acme"), Some("9")));
        assert_eq!(p.literal_prefix(), "/t/");
    }

    #[test]
    fn literals_match_escaped_and_unicode_spellings() {
        let p = PathPattern::parse("/v1/invoices:batch/{id}").unwrap();
        for raw in [
            "/v1/invoices%3Abatch/1",
            "/v1/INVOICES%3aBATCH/1",
            "/v1/invoices:batch/1",
        ] {
            assert_eq!(
                matches(&p, raw).unwrap().path,
                "/v1/invoices:batch/1",
                "{raw}"
            );
        }
        let k = PathPattern::parse("/work/{id}").unwrap();
        assert_eq!(matches(&k, "/wor%E2%84%AA/1").unwrap().path, "/work/1");
        let exact = canonicalize("/wor%E2%84%AA/1").unwrap();
        assert_eq!(k.match_path(&exact, true), Ok(None));
        let cafe = PathPattern::parse("/caf\u{e9}/{id}").unwrap();
        assert!(matches(&cafe, "/CAF%C3%89/1").is_some());
    }

    #[test]
    fn ancestors_of_a_pattern_have_descendants() {
        let p = PathPattern::parse("/files/ledger/{name}").unwrap();
        let path = |raw: &str| canonicalize(raw).unwrap();
        for raw in ["/", "/files", "/files/", "/FILES/Ledger/", "/files/ledger"] {
            assert!(p.has_descendants(&path(raw), false), "{raw}");
        }
        for raw in [
            "/files/ledger/a",
            "/files/public/",
            "/other",
            "/files/ledger/a/b",
        ] {
            assert!(!p.has_descendants(&path(raw), false), "{raw}");
        }
        assert!(PathPattern::parse("/files/{*rest}").unwrap().ends_in_rest());
        assert!(!p.ends_in_rest());
    }

    #[test]
    fn literals_are_canonical() {
        let p = PathPattern::parse("/%69nvoices/{id}").unwrap();
        assert!(matches(&p, "/invoices/1").is_some());
        assert_eq!(p.literal_prefix(), "/invoices/");
        let a = PathPattern::parse("/Invoices/{x}").unwrap();
        let b = PathPattern::parse("/invoices/{id}").unwrap();
        assert!(a.covers(&b, false));
        assert!(!a.covers(&b, true));
        assert!(!a.covers(&PathPattern::parse("/invoices/{*r}").unwrap(), false));
        let rest = PathPattern::parse("/{*rest}").unwrap();
        assert!(rest.covers(&b, false));
        assert!(!b.covers(&rest, false));
        let param = PathPattern::parse("/invoices/{id}").unwrap();
        assert!(param.covers(&PathPattern::parse("/invoices/special").unwrap(), false));
        assert!(!param.covers(&PathPattern::parse("/invoices/special/x").unwrap(), false));
    }

    #[test]
    fn malformed_patterns_are_rejected() {
        assert_eq!(
            PathPattern::parse("x").unwrap_err(),
            PatternError::NoLeadingSlash
        );
        assert!(matches!(
            PathPattern::parse("/a-{id}"),
            Err(PatternError::PartialParam(_))
        ));
        assert!(matches!(
            PathPattern::parse("/{*r}/x"),
            Err(PatternError::RestNotLast(_))
        ));
        assert!(matches!(
            PathPattern::parse("/{a}/{a}"),
            Err(PatternError::DuplicateName(_))
        ));
        assert!(matches!(
            PathPattern::parse("/{a b}"),
            Err(PatternError::BadName(_))
        ));
        for never in ["/a//b", "/a;x/{id}", "/../{id}", "/a%2Fb", "/a%zz"] {
            assert!(
                matches!(
                    PathPattern::parse(never),
                    Err(PatternError::NeverMatches(_))
                ),
                "{never}"
            );
        }
    }
}
