//! Key inputs read from a request's body: a string a JSON pointer (RFC 6901) names, and a field of
//! an `application/x-www-form-urlencoded` body, read as strictly as query parameters are (present
//! once in every reading, non-empty). Only the idempotency layer has the body when it keys.

use http::HeaderMap;

use super::{form_body_field, media_type, RenderError};

/// The string `pointer` names in `body`, a JSON document.
pub fn json_string(body: &[u8], pointer: &str) -> Result<String, RenderError> {
    let document: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| RenderError::BodyNotJson)?;
    match document.pointer(pointer) {
        None => Err(RenderError::MissingJson(pointer.to_owned())),
        Some(serde_json::Value::String(text)) if !text.is_empty() => Ok(text.clone()),
        Some(_) => Err(RenderError::JsonNotString(pointer.to_owned())),
    }
}

/// The one value of field `name` in a form body; the body must say it is a form.
pub fn form_field(headers: &HeaderMap, body: &[u8], name: &str) -> Result<String, RenderError> {
    let is_form = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| media_type(v).eq_ignore_ascii_case("application/x-www-form-urlencoded"));
    if !is_form {
        return Err(RenderError::NotAForm(name.to_owned()));
    }
    let text = std::str::from_utf8(body).map_err(|_| RenderError::NotAForm(name.to_owned()))?;
    form_body_field(text, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_pointers_name_strings() {
        let body = br#"{"payment":{"id":"p-7","amount":100,"tags":["a"]},"empty":""}"#;
        assert_eq!(json_string(body, "/payment/id").as_deref(), Ok("p-7"));
        assert_eq!(
            json_string(body, "/payment/amount"),
            Err(RenderError::JsonNotString("/payment/amount".into()))
        );
        assert_eq!(
            json_string(body, "/empty"),
            Err(RenderError::JsonNotString("/empty".into()))
        );
        assert_eq!(
            json_string(body, "/payment/none"),
            Err(RenderError::MissingJson("/payment/none".into()))
        );
        assert_eq!(json_string(b"{oops", "/a"), Err(RenderError::BodyNotJson));
    }

    #[test]
    fn form_fields_are_read_as_strictly_as_query_parameters() {
        let mut form = HeaderMap::new();
        form.insert(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8"
                .parse()
                .unwrap(),
        );
        assert_eq!(
            form_field(&form, b"a=1&order=o%2D7", "order").as_deref(),
            Ok("o-7")
        );
        assert!(matches!(
            form_field(&form, b"order=1&order=2", "order"),
            Err(RenderError::RepeatedForm(_))
        ));
        assert!(matches!(
            form_field(&form, b"a=1", "order"),
            Err(RenderError::MissingForm(_))
        ));
        let json = HeaderMap::new();
        assert_eq!(
            form_field(&json, b"order=1", "order"),
            Err(RenderError::NotAForm("order".into()))
        );
    }
}
