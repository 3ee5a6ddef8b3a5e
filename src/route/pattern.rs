//! Path patterns such as `/invoices/{id}/send` or `/files/{*rest}`: parsing and matching.

use percent_encoding::percent_decode_str;

use super::{PathRefusal, MAX_CAPTURE_LEN};

/// One segment of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `{name}`: exactly one non-empty segment.
    Param(String),
    /// `{*name}`: the non-empty remainder of the path, slashes included; last only.
    Rest(String),
}

/// A compiled path pattern.
#[derive(Debug, Clone)]
pub struct PathPattern {
    segments: Vec<Segment>,
}

/// The decoded values a match captured, in pattern order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captures(Vec<(String, String)>);

impl Captures {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// These captures plus `extra` values (path segments win over extras of the same name).
    pub fn with(&self, extra: &[(&str, &str)]) -> Captures {
        let mut all = self.0.clone();
        all.extend(
            extra
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned())),
        );
        Captures(all)
    }
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
}

impl PathPattern {
    pub fn parse(pattern: &str) -> Result<PathPattern, PatternError> {
        let body = pattern
            .strip_prefix('/')
            .ok_or(PatternError::NoLeadingSlash)?;
        let raw: Vec<&str> = body.split('/').collect();
        let mut segments = Vec::with_capacity(raw.len());
        for (i, part) in raw.iter().enumerate() {
            let segment = parse_segment(part)?;
            if let Segment::Rest(name) = &segment {
                if i + 1 != raw.len() {
                    return Err(PatternError::RestNotLast(name.clone()));
                }
            }
            if let Segment::Param(name) | Segment::Rest(name) = &segment {
                if segments
                    .iter()
                    .any(|s| matches!(s, Segment::Param(n) | Segment::Rest(n) if n == name))
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
        self.segments.iter().filter_map(|s| match s {
            Segment::Param(n) | Segment::Rest(n) => Some(n.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// The literal prefix before the first parameter (used to keep routes out of reserved space).
    pub fn literal_prefix(&self) -> String {
        let mut prefix = String::from("/");
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => {
                    prefix.push_str(text);
                    prefix.push('/');
                }
                _ => break,
            }
        }
        prefix
    }

    /// Matches a raw (still percent-encoded) request path; captured values are decoded. A capture
    /// that is empty, longer than [`MAX_CAPTURE_LEN`] or not UTF-8 once decoded does not match.
    pub fn matches(&self, path: &str) -> Option<Captures> {
        self.match_path(path).ok().flatten()
    }

    /// Matches a raw request path. `Err` when the path has this pattern's shape (its literals
    /// match) but a capture is empty, oversized or not UTF-8 once decoded: the request was meant
    /// for this route and is malformed, rather than meant for another route.
    pub fn match_path(&self, path: &str) -> Result<Option<Captures>, PathRefusal> {
        let Some(mut rest) = path.strip_prefix('/') else {
            return Ok(None);
        };
        let mut captures = Vec::new();
        let mut refusal = None;
        let mut capture = |name: &str, raw: &str, limit: usize| {
            match check_capture(raw, limit) {
                Ok(value) => captures.push((name.to_owned(), value)),
                Err(why) => {
                    refusal.get_or_insert(why);
                }
            };
        };
        for (i, segment) in self.segments.iter().enumerate() {
            let last = i + 1 == self.segments.len();
            if let Segment::Rest(name) = segment {
                capture(name, rest, usize::MAX);
                rest = "";
                break;
            }
            let (part, tail) = match rest.split_once('/') {
                Some((part, tail)) if !last => (part, tail),
                Some(_) => return Ok(None),
                None if last => (rest, ""),
                None => return Ok(None),
            };
            match segment {
                Segment::Literal(text) => {
                    if part != text {
                        return Ok(None);
                    }
                }
                Segment::Param(name) => capture(name, part, MAX_CAPTURE_LEN),
                Segment::Rest(_) => return Ok(None),
            }
            rest = tail;
        }
        debug_assert!(rest.is_empty());
        match refusal {
            Some(why) => Err(why),
            None => Ok(Some(Captures(captures))),
        }
    }
}

fn parse_segment(part: &str) -> Result<Segment, PatternError> {
    if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
        let (name, rest) = match inner.strip_prefix('*') {
            Some(name) => (name, true),
            None => (inner, false),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(PatternError::BadName(name.to_owned()));
        }
        return Ok(if rest {
            Segment::Rest(name.to_owned())
        } else {
            Segment::Param(name.to_owned())
        });
    }
    if part.contains('{') || part.contains('}') {
        return Err(PatternError::PartialParam(part.to_owned()));
    }
    Ok(Segment::Literal(part.to_owned()))
}

/// A captured value, decoded, or why it cannot be one.
fn check_capture(raw: &str, limit: usize) -> Result<String, PathRefusal> {
    if raw.is_empty() {
        return Err(PathRefusal::EmptySegment);
    }
    if raw.len() > limit {
        return Err(PathRefusal::SegmentTooLong);
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| PathRefusal::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_segment_matches_one_segment() {
        let p = PathPattern::parse("/invoices/{id}").unwrap();
        assert_eq!(p.matches("/invoices/72").unwrap().get("id"), Some("72"));
        assert!(p.matches("/invoices/72/send").is_none());
        assert!(p.matches("/invoices/").is_none());
        assert!(p.matches("/invoices").is_none());
        assert!(p.matches("/other/72").is_none());
    }

    #[test]
    fn captures_are_percent_decoded() {
        let p = PathPattern::parse("/invoices/{id}").unwrap();
        assert_eq!(p.matches("/invoices/%37%32").unwrap().get("id"), Some("72"));
        assert!(p.matches("/invoices/%ff").is_none());
    }

    #[test]
    fn malformed_captures_are_refusals_not_misses() {
        let p = PathPattern::parse("/invoices/{id}/send").unwrap();
        assert_eq!(
            p.match_path("/invoices//send"),
            Err(PathRefusal::EmptySegment)
        );
        assert_eq!(
            p.match_path("/invoices/%ff/send"),
            Err(PathRefusal::NotUtf8)
        );
        let long = format!("/invoices/{}/send", "x".repeat(MAX_CAPTURE_LEN + 1));
        assert_eq!(p.match_path(&long), Err(PathRefusal::SegmentTooLong));
        // Another shape is a miss, whatever its captures look like.
        assert_eq!(p.match_path("/invoices//other"), Ok(None));
        assert_eq!(p.match_path("/other/%ff/send"), Ok(None));
        let rest = PathPattern::parse("/files/{*rest}").unwrap();
        assert_eq!(rest.match_path("/files/"), Err(PathRefusal::EmptySegment));
    }

    #[test]
    fn rest_takes_the_remainder() {
        let p = PathPattern::parse("/files/{*rest}").unwrap();
        assert_eq!(
            p.matches("/files/a/b/c").unwrap().get("rest"),
            Some("a/b/c")
        );
        assert!(p.matches("/files/").is_none());
        assert!(p.matches("/files").is_none());
    }

    #[test]
    fn literal_and_params_mix() {
        let p = PathPattern::parse("/t/{tenant}/invoices/{id}/send").unwrap();
        let c = p.matches("/t/acme/invoices/9/send").unwrap();
        assert_eq!((c.get("tenant"), c.get("id")), (Some("acme"), Some("9")));
        assert_eq!(p.literal_prefix(), "/t/");
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
    }
}
