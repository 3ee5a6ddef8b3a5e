//! Puts a derived idempotency key into a JSON body, for providers that take it as a body field
//! (Square's `idempotency_key`): as a top-level member, inserted into the body's text so that
//! every other byte — numbers of any precision, member order — reaches the provider as the client
//! sent it.

use bytes::Bytes;

use crate::route::RenderError;

/// `body` with `key` as the top-level string member `pointer` names (`/idempotency_key`). A body
/// that already carries the same key is sent unchanged; one that carries another value there is
/// refused, as is a body that is not a JSON object.
pub fn inject_json(body: &Bytes, pointer: &str, key: &str) -> Result<Bytes, RenderError> {
    let member = pointer
        .strip_prefix('/')
        .map(|token| token.replace("~1", "/").replace("~0", "~"))
        .ok_or_else(|| RenderError::InjectConflict(pointer.to_owned()))?;
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|_| RenderError::BodyNotJson)?;
    match object.get(&member) {
        Some(serde_json::Value::String(sent)) if sent == key => return Ok(body.clone()),
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
    let name = serde_json::to_string(&member).map_err(|_| RenderError::BodyNotJson)?;
    let value = serde_json::to_string(key).map_err(|_| RenderError::BodyNotJson)?;
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

    fn inject(body: &str) -> Result<String, RenderError> {
        inject_json(&Bytes::from(body.to_owned()), "/idempotency_key", "k-1")
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    #[test]
    fn the_key_is_inserted_and_every_other_byte_kept() {
        assert_eq!(
            inject(r#" {"amount": 123456789012345678901234567890, "b": 1}"#).unwrap(),
            r#" {"idempotency_key":"k-1","amount": 123456789012345678901234567890, "b": 1}"#
        );
        assert_eq!(inject("{ }").unwrap(), r#"{"idempotency_key":"k-1" }"#);
        assert_eq!(
            inject(r#"{"idempotency_key":"k-1"}"#).unwrap(),
            r#"{"idempotency_key":"k-1"}"#
        );
        for (body, error) in [
            (
                r#"{"idempotency_key":"other"}"#,
                RenderError::InjectConflict("/idempotency_key".into()),
            ),
            (
                r#"{"idempotency_key":7}"#,
                RenderError::InjectConflict("/idempotency_key".into()),
            ),
            ("[1]", RenderError::BodyNotJson),
            ("not json", RenderError::BodyNotJson),
        ] {
            assert_eq!(inject(body), Err(error), "{body}");
        }
        let escaped = inject_json(&Bytes::from_static(b"{}"), "/a~1b", "q\"x").unwrap();
        assert_eq!(&escaped[..], br#"{"a/b":"q\"x"}"#);
    }
}
