//! Puts a derived idempotency key into a JSON body, for providers that take it as a body field
//! (Square's `idempotency_key`): as a top-level member, inserted into (or replaced in) the body's
//! text so that every other byte — numbers of any precision, member order — reaches the provider
//! as the client sent it.

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::route::RenderError;

/// A JSON object's top-level members as written: each name with its value's text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Collect;
        impl<'de> Visitor<'de> for Collect {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(entry);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Collect)
    }
}

/// The member `pointer` names (`/idempotency_key` → `idempotency_key`).
fn member_name(pointer: &str) -> Result<String, RenderError> {
    pointer
        .strip_prefix('/')
        .map(|token| token.replace("~1", "/").replace("~0", "~"))
        .ok_or_else(|| RenderError::InjectConflict(pointer.to_owned()))
}

/// Where the member sits in `body`: the byte range of its value's text, and that value.
/// `Ok(None)`: the object has no such member. A body that is not a JSON object, a member written
/// twice (parsers disagree on which one counts) or one that is not a string is refused.
fn find_member(
    body: &[u8],
    pointer: &str,
) -> Result<Option<(std::ops::Range<usize>, String)>, RenderError> {
    let name = member_name(pointer)?;
    let members: Members<'_> =
        serde_json::from_slice(body).map_err(|_| RenderError::BodyNotJson)?;
    let mut found = members.0.iter().filter(|(member, _)| *member == name);
    let Some((_, raw)) = found.next() else {
        return Ok(None);
    };
    if found.next().is_some() {
        return Err(RenderError::InjectConflict(pointer.to_owned()));
    }
    let value: String = serde_json::from_str(raw.get())
        .map_err(|_| RenderError::InjectConflict(pointer.to_owned()))?;
    // The raw value borrows from `body`: its place there is the distance between the two.
    let start = (raw.get().as_ptr() as usize)
        .checked_sub(body.as_ptr() as usize)
        .filter(|start| start + raw.get().len() <= body.len())
        .ok_or(RenderError::BodyNotJson)?;
    Ok(Some((start..start + raw.get().len(), value)))
}

/// The key the client wrote at `pointer` in its JSON body, if any.
pub fn client_key_in_body(body: &[u8], pointer: &str) -> Result<Option<String>, RenderError> {
    Ok(find_member(body, pointer)?.map(|(_, value)| value))
}

/// `body` with `key` as the top-level string member `pointer` names. A body that already carries
/// the same key is sent unchanged; one that carries another string there has it replaced when
/// `replace`, and is refused otherwise, as is a body that is not a JSON object.
pub fn inject_json(
    body: &Bytes,
    pointer: &str,
    key: &str,
    replace: bool,
) -> Result<Bytes, RenderError> {
    let value = serde_json::to_string(key).map_err(|_| RenderError::BodyNotJson)?;
    match find_member(body, pointer)? {
        Some((_, sent)) if sent == key => return Ok(body.clone()),
        Some((place, _)) if replace => {
            let mut replaced = Vec::with_capacity(body.len() + value.len());
            replaced.extend_from_slice(&body[..place.start]);
            replaced.extend_from_slice(value.as_bytes());
            replaced.extend_from_slice(&body[place.end..]);
            return Ok(Bytes::from(replaced));
        }
        Some(_) => return Err(RenderError::InjectConflict(pointer.to_owned())),
        None => {}
    }
    // A JSON object's text starts, after white space, with '{'.
    let text = &body[..];
    let open = text
        .iter()
        .position(|&b| b == b'{')
        .ok_or(RenderError::BodyNotJson)?;
    let rest = &text[open + 1..];
    let empty = rest
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'}');
    let name =
        serde_json::to_string(&member_name(pointer)?).map_err(|_| RenderError::BodyNotJson)?;
    let mut injected = Vec::with_capacity(body.len() + name.len() + value.len() + 2);
    injected.extend_from_slice(&text[..=open]);
    injected.extend_from_slice(name.as_bytes());
    injected.push(b':');
    injected.extend_from_slice(value.as_bytes());
    if !empty {
        injected.push(b',');
    }
    injected.extend_from_slice(rest);
    Ok(Bytes::from(injected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inject(body: &str, replace: bool) -> Result<String, RenderError> {
        inject_json(
            &Bytes::from(body.to_owned()),
            "/idempotency_key",
            "k-1",
            replace,
        )
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    #[test]
    fn the_key_is_inserted_and_every_other_byte_kept() {
        for replace in [false, true] {
            assert_eq!(
                inject(
                    r#" {"amount": 123456789012345678901234567890, "b": 1}"#,
                    replace
                )
                .unwrap(),
                r#" {"idempotency_key":"k-1","amount": 123456789012345678901234567890, "b": 1}"#
            );
            assert_eq!(
                inject("{ }", replace).unwrap(),
                r#"{"idempotency_key":"k-1" }"#
            );
            assert_eq!(
                inject(r#"{"idempotency_key":"k-1"}"#, replace).unwrap(),
                r#"{"idempotency_key":"k-1"}"#
            );
        }
        let escaped = inject_json(&Bytes::from_static(b"{}"), "/a~1b", "q\"x", false).unwrap();
        assert_eq!(&escaped[..], br#"{"a/b":"q\"x"}"#);
    }

    #[test]
    fn another_key_is_replaced_in_place_or_refused() {
        assert_eq!(
            inject(
                r#"{"a": 1.50, "idempotency_key" : "client\u00e9-key", "z": [1]}"#,
                true
            )
            .unwrap(),
            r#"{"a": 1.50, "idempotency_key" : "k-1", "z": [1]}"#
        );
        assert_eq!(
            inject(r#"{"idempotency_key":"other"}"#, false),
            Err(RenderError::InjectConflict("/idempotency_key".into()))
        );
        for body in [
            r#"{"idempotency_key":7}"#,
            r#"{"idempotency_key":"a","idempotency_key":"b"}"#,
        ] {
            for replace in [false, true] {
                assert_eq!(
                    inject(body, replace),
                    Err(RenderError::InjectConflict("/idempotency_key".into())),
                    "{body}"
                );
            }
        }
        for body in ["[1]", "not json", r#"{"a":1} x"#] {
            assert_eq!(inject(body, true), Err(RenderError::BodyNotJson), "{body}");
        }
    }

    #[test]
    fn the_clients_key_is_read_from_the_body() {
        let read = |body: &str| client_key_in_body(body.as_bytes(), "/idempotency_key");
        assert_eq!(
            read(r#"{"idempotency_key":"c\"1"}"#),
            Ok(Some("c\"1".into()))
        );
        assert_eq!(read(r#"{"other":"x"}"#), Ok(None));
        assert_eq!(read("[]"), Err(RenderError::BodyNotJson));
    }
}
