//! Fuzzes resource-key templates: compiles an arbitrary template against an arbitrary path
//! pattern and renders it from an arbitrary path, query and headers.
//!
//! Input: UTF-8 lines — template, pattern, path, query, then `name: value` header lines.
#![no_main]

use fencegate::route::{
    canonicalize, Captures, KeyTemplate, PathPattern, RequestParts, TemplateError,
    MAX_RESOURCE_KEY_LEN,
};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let template = lines.next().unwrap_or_default();
    let pattern = lines.next().unwrap_or_default();
    let path = lines.next().unwrap_or_default();
    let query = lines.next().filter(|q| !q.is_empty());
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(name, value);
        }
    }
    let (names, captures): (Vec<String>, Captures) = match PathPattern::parse(pattern) {
        Ok(pattern) => {
            let names = pattern.param_names().map(str::to_owned).collect();
            let captures = canonicalize(path)
                .ok()
                .and_then(|canonical| pattern.match_path(&canonical, false).ok().flatten())
                .map(|found| found.captures)
                .unwrap_or_default();
            (names, captures)
        }
        Err(_) => (Vec::new(), Captures::default()),
    };
    let compiled = KeyTemplate::parse(template, names.iter().map(String::as_str));
    let plain = !template.contains(['{', '}']);
    match &compiled {
        Err(TemplateError::Empty) => assert!(template.is_empty()),
        Err(_) => assert!(!plain, "plain template {template:?} refused: {compiled:?}"),
        Ok(_) => {}
    }
    let Ok(compiled) = compiled else {
        return;
    };
    let parts = RequestParts {
        captures: &captures,
        headers: &headers,
        query,
    };
    let rendered = compiled.render(&parts);
    // Rendering reads the request only: twice gives the same answer.
    assert_eq!(rendered, compiled.render(&parts));
    if let Ok(key) = &rendered {
        assert!(
            key.len() <= MAX_RESOURCE_KEY_LEN,
            "key of {} bytes",
            key.len()
        );
        if plain {
            assert_eq!(key, template);
        }
    }
});
