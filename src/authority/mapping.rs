//! From a lock's name to the resource key it guards, and back: two templates over the same
//! `{name}` placeholders (`locks/invoice/{id}` and `invoice:{id:int}`). A placeholder stands for
//! one or more characters other than `/`; a typed one only for a value of its type spelled in its
//! canonical form (`locks/invoice/042` is no lock of `invoice:{id:int}`: one resource, one lock).

use std::borrow::Cow;
use std::collections::BTreeSet;

use crate::input_type::InputType;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Slot(String),
}

/// The type of each placeholder of a mapping, as either template or the route's path declares it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct SlotTypes(Vec<(String, InputType)>);

impl SlotTypes {
    fn of(&self, name: &str) -> InputType {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or(InputType::Untyped, |(_, kind)| *kind)
    }

    /// Records `name`'s type; two different declared types of one name are an error.
    fn declare(&mut self, name: &str, kind: InputType) -> Result<(), String> {
        if kind == InputType::Untyped {
            return Ok(());
        }
        match self.0.iter().find(|(n, _)| n == name) {
            Some((_, known)) if *known != kind => Err(format!(
                "placeholder {{{name}}} is declared both {{{name}{known}}} and {{{name}{kind}}}"
            )),
            Some(_) => Ok(()),
            None => {
                self.0.push((name.to_owned(), kind));
                Ok(())
            }
        }
    }
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
    /// Parses `text`, recording the types its placeholders declare in `types`.
    fn parse(
        text: &str,
        field: &'static str,
        types: &mut SlotTypes,
    ) -> Result<Template, MappingError> {
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
                    let placeholder = &after[..end];
                    let (name, kind) = match placeholder.split_once(':') {
                        Some((name, suffix)) => match InputType::from_suffix(suffix) {
                            Some(kind) => (name, kind),
                            None => {
                                return Err(fail(format!(
                                    "{text:?}: placeholder {{{placeholder}}}: unknown type (use `:int`, `:uuid` or `:str`)"
                                )))
                            }
                        },
                        None => (placeholder, InputType::Untyped),
                    };
                    if name.is_empty()
                        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    {
                        return Err(fail(format!(
                            "{text:?}: placeholder {{{name}}} must be a plain name (letters, digits, '_'), optionally typed"
                        )));
                    }
                    types.declare(name, kind).map_err(fail)?;
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

    /// The placeholders' values when `text` matches, typed ones in canonical form, else `None`.
    fn capture<'t>(&self, text: &'t str, types: &SlotTypes) -> Option<Vec<(&str, Cow<'t, str>)>> {
        let mut found = Vec::new();
        capture_from(&self.pieces, text, types, &mut found).then_some(found)
    }

    fn render(&self, values: &[(&str, Cow<'_, str>)]) -> Option<String> {
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

/// Matches `pieces` against all of `text`, trying each length a placeholder may take; a typed
/// placeholder takes only a value of its type, and keeps it in canonical form.
fn capture_from<'p, 't>(
    pieces: &'p [Piece],
    text: &'t str,
    types: &SlotTypes,
    found: &mut Vec<(&'p str, Cow<'t, str>)>,
) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return text.is_empty();
    };
    match first {
        Piece::Text(literal) => text
            .strip_prefix(literal.as_str())
            .is_some_and(|after| capture_from(rest, after, types, found)),
        Piece::Slot(name) => {
            let kind = match types.of(name) {
                // An untyped value is passed on as it is: the requests' keys check theirs.
                InputType::Untyped => InputType::Str,
                kind => kind,
            };
            let run = text.find('/').unwrap_or(text.len());
            for end in (1..=run).filter(|&end| text.is_char_boundary(end)) {
                let (raw, after) = text.split_at(end);
                // A typed value only in its canonical form: `locks/invoice/042` and
                // `locks/invoice/42` are two locks in the lock service, and one resource has one
                // lock.
                let value = match kind.read(raw) {
                    Ok(value) if value == raw => value,
                    _ => continue,
                };
                // A repeated placeholder must repeat its value.
                if found.iter().any(|(n, v)| n == name && *v != value) {
                    continue;
                }
                found.push((name.as_str(), value));
                if capture_from(rest, after, types, found) {
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
    types: SlotTypes,
}

impl LockMapping {
    /// Both templates must name the same placeholders, so that each lock guards one resource
    /// and each resource has one lock.
    pub fn parse(lock_key: &str, resource_key: &str) -> Result<LockMapping, MappingError> {
        LockMapping::parse_typed(lock_key, resource_key, |_| InputType::Untyped)
    }

    /// [`parse`](Self::parse), where a placeholder neither template types takes the type
    /// `path_type` gives its name (the route's path: `/invoices/{id:int}`).
    pub fn parse_typed(
        lock_key: &str,
        resource_key: &str,
        path_type: impl Fn(&str) -> InputType,
    ) -> Result<LockMapping, MappingError> {
        let mut types = SlotTypes::default();
        let lock = Template::parse(lock_key, "fence.authority.lock_key", &mut types)?;
        let resource = Template::parse(resource_key, "fence.authority.resource_key", &mut types)?;
        if lock.names() != resource.names() {
            return Err(MappingError {
                field: "fence.authority.resource_key",
                message: format!(
                    "{resource_key:?} must use exactly the placeholders of lock_key {lock_key:?}, so that every lock guards one resource and every resource has one lock"
                ),
            });
        }
        for name in lock.names() {
            if types.of(name) == InputType::Untyped {
                // Cannot conflict: the name has no declared type yet.
                let _ = types.declare(name, path_type(name));
            }
        }
        Ok(LockMapping {
            lock,
            resource,
            types,
        })
    }

    /// The text every lock key of this mapping starts with (what a watch or a scan covers).
    pub fn lock_prefix(&self) -> &str {
        self.lock.literal_prefix()
    }

    /// How many `/` a lock's name has: a placeholder stands for no `/`, so every lock of the
    /// mapping has the same number (a ZooKeeper lock node's depth).
    pub fn lock_slashes(&self) -> usize {
        self.lock
            .pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.matches('/').count(),
                Piece::Slot(_) => 0,
            })
            .sum()
    }

    /// The resource `lock` guards, when `lock` is one of this mapping's locks.
    pub fn resource_of(&self, lock: &str) -> Option<String> {
        self.resource.render(&self.lock.capture(lock, &self.types)?)
    }

    /// The lock guarding `resource`, when `resource` is one of this mapping's resources.
    pub fn lock_of(&self, resource: &str) -> Option<String> {
        self.lock
            .render(&self.resource.capture(resource, &self.types)?)
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
    fn typed_placeholders_pass_canonical_values_on() {
        let m = mapping("locks/invoice/{id:int}", "invoice:{id}");
        assert_eq!(
            m.resource_of("locks/invoice/42").as_deref(),
            Some("invoice:42")
        );
        // Another spelling is another lock, guarding no resource of this mapping.
        assert_eq!(m.resource_of("locks/invoice/042"), None);
        assert_eq!(m.resource_of("locks/invoice/x42"), None);
        assert_eq!(m.lock_of("invoice:007"), None);
        let uuid = mapping("locks/{id}", "ticket:{id:uuid}");
        let canonical = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
        assert_eq!(
            uuid.resource_of(&format!("locks/{canonical}")).as_deref(),
            Some(format!("ticket:{canonical}").as_str())
        );
        assert_eq!(
            uuid.resource_of("locks/A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),
            None
        );
        // The route's path types what the templates leave untyped.
        let by_path = LockMapping::parse_typed("locks/{id}", "invoice:{id}", |name| {
            if name == "id" {
                InputType::Int
            } else {
                InputType::Untyped
            }
        })
        .expect("valid mapping");
        assert_eq!(by_path.resource_of("locks/0042"), None);
        assert_eq!(by_path.resource_of("locks/x"), None);
        assert_eq!(
            by_path.resource_of("locks/42").as_deref(),
            Some("invoice:42")
        );
        let untyped = mapping("locks/{id}", "invoice:{id}");
        assert_eq!(
            untyped.resource_of("locks/042").as_deref(),
            Some("invoice:042")
        );
        let e = LockMapping::parse("locks/{id:int}", "r:{id:uuid}").expect_err("two types");
        assert_eq!(e.field, "fence.authority.resource_key");
        assert!(LockMapping::parse("locks/{id:float}", "r:{id}").is_err());
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
