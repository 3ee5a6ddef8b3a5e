//! From a lock's name to the resource key it guards, and back: two templates over the same
//! `{name}` placeholders (`locks/invoice/{id}` and `invoice:{id}`). A placeholder stands for one
//! or more characters other than `/`.

use std::collections::BTreeSet;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Slot(String),
}

/// A template of text and placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Template {
    pieces: Vec<Piece>,
}

/// Why a template cannot be used; `field` names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct MappingError {
    pub field: &'static str,
    pub message: String,
}

impl Template {
    fn parse(text: &str, field: &'static str) -> Result<Template, MappingError> {
        let fail = |message: String| MappingError { field, message };
        if text.is_empty() {
            return Err(fail("must not be empty".to_owned()));
        }
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    pieces.push(Piece::Text(rest.to_owned()));
                    break;
                }
                Some(i) if rest.as_bytes()[i] == b'}' => {
                    return Err(fail(format!("{text:?}: unbalanced '}}'")))
                }
                Some(i) => {
                    if i > 0 {
                        pieces.push(Piece::Text(rest[..i].to_owned()));
                    } else if matches!(pieces.last(), Some(Piece::Slot(_))) {
                        return Err(fail(format!(
                            "{text:?}: two placeholders need text between them, or the key cannot be split back into them"
                        )));
                    }
                    let after = &rest[i + 1..];
                    let end = after
                        .find('}')
                        .ok_or_else(|| fail(format!("{text:?}: unbalanced '{{'")))?;
                    let name = &after[..end];
                    if name.is_empty()
                        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    {
                        return Err(fail(format!(
                            "{text:?}: placeholder {{{name}}} must be a plain name (letters, digits, '_')"
                        )));
                    }
                    pieces.push(Piece::Slot(name.to_owned()));
                    rest = &after[end + 1..];
                }
            }
        }
        Ok(Template { pieces })
    }

    fn names(&self) -> BTreeSet<&str> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Slot(name) => Some(name.as_str()),
                Piece::Text(_) => None,
            })
            .collect()
    }

    /// The text before the first placeholder.
    fn literal_prefix(&self) -> &str {
        match self.pieces.first() {
            Some(Piece::Text(text)) => text,
            _ => "",
        }
    }

    /// The placeholders' values when `text` matches, else `None`.
    fn capture<'t>(&self, text: &'t str) -> Option<Vec<(&str, &'t str)>> {
        let mut found = Vec::new();
        capture_from(&self.pieces, text, &mut found).then_some(found)
    }

    fn render(&self, values: &[(&str, &str)]) -> Option<String> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Slot(name) => {
                    let (_, value) = values.iter().find(|(n, _)| n == name)?;
                    out.push_str(value);
                }
            }
        }
        Some(out)
    }
}

/// Matches `pieces` against all of `text`, trying each length a placeholder may take.
fn capture_from<'p, 't>(
    pieces: &'p [Piece],
    text: &'t str,
    found: &mut Vec<(&'p str, &'t str)>,
) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return text.is_empty();
    };
    match first {
        Piece::Text(literal) => text
            .strip_prefix(literal.as_str())
            .is_some_and(|after| capture_from(rest, after, found)),
        Piece::Slot(name) => {
            let run = text.find('/').unwrap_or(text.len());
            for end in (1..=run).filter(|&end| text.is_char_boundary(end)) {
                let (value, after) = text.split_at(end);
                // A repeated placeholder must repeat its value.
                if found.iter().any(|(n, v)| n == name && *v != value) {
                    continue;
                }
                found.push((name.as_str(), value));
                if capture_from(rest, after, found) {
                    return true;
                }
                found.pop();
            }
            false
        }
    }
}

/// A route's `lock_key` and `resource_key`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockMapping {
    lock: Template,
    resource: Template,
}

impl LockMapping {
    /// Both templates must name the same placeholders, so that each lock guards one resource
    /// and each resource has one lock.
    pub fn parse(lock_key: &str, resource_key: &str) -> Result<LockMapping, MappingError> {
        let lock = Template::parse(lock_key, "fence.authority.lock_key")?;
        let resource = Template::parse(resource_key, "fence.authority.resource_key")?;
        if lock.names() != resource.names() {
            return Err(MappingError {
                field: "fence.authority.resource_key",
                message: format!(
                    "{resource_key:?} must use exactly the placeholders of lock_key {lock_key:?}, so that every lock guards one resource and every resource has one lock"
                ),
            });
        }
        Ok(LockMapping { lock, resource })
    }

    /// The text every lock key of this mapping starts with (what a watch or a scan covers).
    pub fn lock_prefix(&self) -> &str {
        self.lock.literal_prefix()
    }

    /// The resource `lock` guards, when `lock` is one of this mapping's locks.
    pub fn resource_of(&self, lock: &str) -> Option<String> {
        self.resource.render(&self.lock.capture(lock)?)
    }

    /// The lock guarding `resource`, when `resource` is one of this mapping's resources.
    pub fn lock_of(&self, resource: &str) -> Option<String> {
        self.lock.render(&self.resource.capture(resource)?)
    }

    /// The lock and resource of a stored etcd key: the key itself when it is a lock's name (a
    /// lock held by one key), else its parent when that is one (`<lock>/<contender>`).
    pub fn lock_of_key(&self, key: &str) -> Option<(String, String)> {
        if let Some(resource) = self.resource_of(key) {
            return Some((key.to_owned(), resource));
        }
        let (parent, contender) = key.rsplit_once('/')?;
        if contender.is_empty() {
            return None;
        }
        let resource = self.resource_of(parent)?;
        Some((parent.to_owned(), resource))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(lock: &str, resource: &str) -> LockMapping {
        LockMapping::parse(lock, resource).expect("valid mapping")
    }

    #[test]
    fn a_lock_maps_to_its_resource_and_back() {
        let m = mapping("locks/invoice/{id}", "invoice:{id}");
        assert_eq!(
            m.resource_of("locks/invoice/42").as_deref(),
            Some("invoice:42")
        );
        assert_eq!(m.lock_of("invoice:42").as_deref(), Some("locks/invoice/42"));
        assert_eq!(m.lock_prefix(), "locks/invoice/");
        assert_eq!(m.resource_of("locks/invoice/"), None);
        assert_eq!(m.resource_of("locks/order/42"), None);
        assert_eq!(m.resource_of("locks/invoice/42/x"), None);
    }

    #[test]
    fn etcd_contender_keys_belong_to_their_parent_lock() {
        let m = mapping("locks/invoice/{id}", "invoice:{id}");
        assert_eq!(
            m.lock_of_key("locks/invoice/42/694d8a1b2c"),
            Some(("locks/invoice/42".to_owned(), "invoice:42".to_owned()))
        );
        assert_eq!(
            m.lock_of_key("locks/invoice/42"),
            Some(("locks/invoice/42".to_owned(), "invoice:42".to_owned()))
        );
        assert_eq!(m.lock_of_key("locks/invoice/42/a/b"), None);
        assert_eq!(m.lock_of_key("locks/invoice/42/"), None);
    }

    #[test]
    fn several_placeholders_split_at_their_text() {
        let m = mapping("t/{tenant}/doc-{doc}", "doc:{tenant}:{doc}");
        assert_eq!(
            m.resource_of("t/acme/doc-7-b").as_deref(),
            Some("doc:acme:7-b")
        );
        assert_eq!(m.lock_of("doc:acme:7-b").as_deref(), Some("t/acme/doc-7-b"));
    }

    #[test]
    fn mismatched_or_ambiguous_templates_are_refused() {
        let e = LockMapping::parse("locks/{id}", "invoice:{other}").expect_err("different names");
        assert_eq!(e.field, "fence.authority.resource_key");
        let e = LockMapping::parse("locks/{a}{b}", "r:{a}:{b}").expect_err("adjacent");
        assert_eq!(e.field, "fence.authority.lock_key");
        assert!(LockMapping::parse("locks/{id", "r:{id}").is_err());
        assert!(LockMapping::parse("locks/{i-d}", "r:{i-d}").is_err());
        assert!(LockMapping::parse("", "r").is_err());
    }
}
