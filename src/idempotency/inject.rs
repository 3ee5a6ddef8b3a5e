//! Puts a derived idempotency key into a JSON body, for providers that take it as a body field
//! (Square's `idempotency_key`, or a member of a GraphQL mutation's `variables`): as a member of the
//! body's object or of an object within it, inserted into (or replaced in) the body's
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

/// The member names `pointer` walks (`/variables/input/idempotencyKey` → three), unescaped.
fn member_names(pointer: &str) -> Result<Vec<String>, RenderError> {
    pointer
        .strip_prefix('/')
        .map(|rest| {
            rest.split('/')
                .map(|token| token.replace("~1", "/").replace("~0", "~"))
                .collect()
        })
        .ok_or_else(|| RenderError::InjectConflict(pointer.to_owned()))
}

/// Where `pointer` leads in `body`: the byte range of the object that holds (or would hold) the
/// member, and the member's value range and string, if it is there.
struct Located {
    object: std::ops::Range<usize>,
    member: Option<(std::ops::Range<usize>, String)>,
}

/// Walks `pointer` through `body`'s objects. A body that is not a JSON object, an object on the
/// way that is missing or is not an object, a member written twice (parsers disagree on which
/// one counts) and a final member that is not a string are refused.
fn locate(body: &[u8], pointer: &str) -> Result<Located, RenderError> {
    let names = member_names(pointer)?;
    let conflict = || RenderError::InjectConflict(pointer.to_owned());
    let mut object = 0..body.len();
    for (depth, name) in names.iter().enumerate() {
        let members: Members<'_> = serde_json::from_slice(&body[object.clone()]).map_err(|_| {
            if depth == 0 {
                RenderError::BodyNotJson
            } else {
                conflict()
            }
        })?;
        let mut found = members.0.iter().filter(|(member, _)| member == name);
        let first = found.next();
        if found.next().is_some() {
            return Err(conflict());
        }
        let last = depth + 1 == names.len();
        let Some((_, raw)) = first else {
            return if last {
                Ok(Located {
                    object,
                    member: None,
                })
            } else {
                Err(conflict())
            };
        };
        // The raw value borrows from `body`: its place there is the distance between the two.
        let start = (raw.get().as_ptr() as usize)
            .checked_sub(body.as_ptr() as usize)
            .filter(|start| start + raw.get().len() <= body.len())
            .ok_or(RenderError::BodyNotJson)?;
        let range = start..start + raw.get().len();
        if last {
            let value: String = serde_json::from_str(raw.get()).map_err(|_| conflict())?;
            return Ok(Located {
                object,
                member: Some((range, value)),
            });
        }
        object = range;
    }
    Err(conflict())
}

/// The key the client wrote at `pointer` in its JSON body, if any.
pub fn client_key_in_body(body: &[u8], pointer: &str) -> Result<Option<String>, RenderError> {
    Ok(locate(body, pointer)?.member.map(|(_, value)| value))
}

/// `body` with `key` as the string member `pointer` names (in the top-level object, or in an
/// object within it: `/variables/input/idempotencyKey`). A body that already carries the same
/// key is sent unchanged; one that carries another string there has it replaced when `replace`,
/// and is refused otherwise, as is a body that is not a JSON object.
pub fn inject_json(
    body: &Bytes,
    pointer: &str,
    key: &str,
    replace: bool,
) -> Result<Bytes, RenderError> {
    let value = serde_json::to_string(key).map_err(|_| RenderError::BodyNotJson)?;
    let located = locate(body, pointer)?;
    match located.member {
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
    // The object's text starts, after white space, with '{'.
    let object = &body[located.object.clone()];
    let open = located.object.start
        + object
            .iter()
            .position(|&b| b == b'{')
            .ok_or(RenderError::BodyNotJson)?;
    let rest = &body[open + 1..];
    let empty = rest
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'}');
    let last = member_names(pointer)?.pop().unwrap_or_default();
    let name = serde_json::to_string(&last).map_err(|_| RenderError::BodyNotJson)?;
    let mut injected = Vec::with_capacity(body.len() + name.len() + value.len() + 2);
    injected.extend_from_slice(&body[..=open]);
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

    #[test]
    fn a_nested_member_is_found_inserted_and_replaced() {
        let pointer = "/variables/input/idempotencyKey";
        let body = Bytes::from_static(
            br#"{"query":"mutation { chargePaymentMethod }","variables":{"input":{"amount":"1.00"}}}"#,
        );
        let injected = inject_json(&body, pointer, "k-1", false).unwrap();
        assert_eq!(
            &injected[..],
            br#"{"query":"mutation { chargePaymentMethod }","variables":{"input":{"idempotencyKey":"k-1","amount":"1.00"}}}"#
        );
        assert_eq!(
            client_key_in_body(&injected, pointer),
            Ok(Some("k-1".to_owned()))
        );
        let theirs = Bytes::from_static(
            br#"{"variables":{"input":{"idempotencyKey":"mine","amount":"1.00"}},"query":"q"}"#,
        );
        assert_eq!(
            &inject_json(&theirs, pointer, "k-1", true).unwrap()[..],
            br#"{"variables":{"input":{"idempotencyKey":"k-1","amount":"1.00"}},"query":"q"}"#
        );
        for refused in [
            &br#"{"variables":{}}"#[..],
            br#"{"variables":{"input":[1]}}"#,
            br#"{"variables":"x"}"#,
            br#"{"variables":{"input":{}},"variables":{"input":{}}}"#,
        ] {
            assert_eq!(
                inject_json(&Bytes::copy_from_slice(refused), pointer, "k-1", true),
                Err(RenderError::InjectConflict(pointer.to_owned())),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }
}
