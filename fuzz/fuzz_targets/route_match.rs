//! Fuzzes route matching: a fixed route table (literals, parameters, a rest parameter, overlapping
//! patterns) against arbitrary method + path, checking first-match order, capture decoding and
//! that the gateway's reserved prefix is never routed.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use fencegate::config::parse_str;
use fencegate::route::{canonicalize, RequestParts, RouteTable, RESERVED_PREFIX};
use http::{HeaderMap, Method};
use libfuzzer_sys::fuzz_target;

const TABLE: &str = r#"
[server]
listen = "127.0.0.1:8080"

[[routes]]
name = "send"
path = "/invoices/{id}/send"
upstream = "http://127.0.0.1:9000"
resource_key = "invoice:{id}"

[[routes]]
name = "invoice"
path = "/invoices/{id}"
upstream = "http://127.0.0.1:9000"
resource_key = "invoice:{id}"

[[routes]]
name = "tenant-doc"
path = "/t/{tenant}/docs/{doc}"
methods = ["PUT", "DELETE"]
upstream = "http://127.0.0.1:9000"
resource_key = "doc:{tenant}/{doc}"

[[routes]]
name = "files"
path = "/files/{*rest}"
upstream = "http://127.0.0.1:9000"
resource_key = "file:{rest}"

[[routes]]
name = "root"
path = "/"
upstream = "http://127.0.0.1:9000"
[routes.fence]
mode = "off"
"#;

/// Compiled once per process: the target fuzzes matching, not loading.
static TABLE_COMPILED: OnceLock<RouteTable> = OnceLock::new();

fn compile_table() -> RouteTable {
    let Ok(config) = parse_str(TABLE, Path::new("route_match.toml")) else {
        panic!("the fixed route table must load");
    };
    let Ok(table) = RouteTable::compile(&config.routes) else {
        panic!("the fixed route table must compile");
    };
    table
}

const METHODS: [&str; 6] = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, path)) = data.split_first() else {
        return;
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let table = TABLE_COMPILED.get_or_init(compile_table);
    let method = Method::from_bytes(METHODS[usize::from(selector) % METHODS.len()].as_bytes())
        .unwrap_or(Method::GET);
    let Ok(canonical) = canonicalize(path) else {
        return;
    };
    let Ok(found) = table.find(&canonical, &method) else {
        return;
    };
    if path.starts_with(RESERVED_PREFIX) {
        assert!(found.is_none(), "reserved path {path:?} was routed");
    }
    let matches = |route: &fencegate::route::CompiledRoute| {
        route
            .pattern
            .match_path(&canonical, route.case_sensitive)
            .ok()
            .flatten()
            .is_some()
    };
    let Some(routed) = found else {
        // No route matched: none of them matches on its own either.
        assert!(table.routes().all(|r| !matches(r)));
        return;
    };
    // The match is the first route, in file order, whose pattern matches.
    for route in table.routes() {
        if route.name == routed.route.name {
            break;
        }
        assert!(
            !matches(route),
            "{path:?}: earlier route {} matches",
            route.name
        );
    }
    // What is forwarded is canonical too, and routes to the same route.
    let forwarded = canonicalize(&routed.path).expect("the forwarded path is canonical");
    assert_eq!(forwarded.as_str(), routed.path, "{path:?}");
    // Every name the pattern captures has a value, non-empty.
    for name in routed.route.pattern.param_names() {
        let value = routed.captures.get(name);
        assert!(
            value.is_some_and(|v| !v.is_empty()),
            "{path:?}: capture {name} is {value:?}"
        );
    }
    let _ = routed.route.fences(&method);
    if let Some(template) = &routed.route.resource_key {
        let headers = HeaderMap::new();
        let parts = RequestParts {
            captures: &routed.captures,
            headers: &headers,
            query: None,
        };
        if let Ok(key) = template.render(&parts) {
            assert!(key.len() <= fencegate::route::MAX_RESOURCE_KEY_LEN);
        }
    }
});
