//! Micro-benchmarks of the per-request hot path, everything a fenced request does in-process before
//! the store round trip and the upstream call:
//!
//! - `token/*`: parsing the fencing token (`parse_fence_token`, `read_fence_header`);
//! - `route/*`: finding the route in a table of 20 routes parsed from TOML (hit near the end, miss);
//! - `key/*`: rendering the resource key (`invoice:{id}`, and one that reads a header too);
//! - `cache/*`: the mark cache with 100k keys (`refuses` hit and miss, `raise` of a cached key and
//!   of a new key at capacity, which evicts one);
//! - `headers/*`: rewriting a 12-header request (strip hop-by-hop, append `Via` and `Forwarded`).
//!
//! Run with `cargo bench --bench hot_path` (add `-- <filter>` to run a subset, e.g. `-- cache/`).
//! `cargo test --all-targets` runs each benchmark once as a smoke test.

use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use fencegate::config::Compare;
use fencegate::guard::MarkCache;
use fencegate::proxy::{
    append_forwarded_headers, append_via, strip_hop_by_hop_headers, ClientNode, ForwardedFor,
};
use fencegate::route::{canonicalize, KeyTemplate, PathPattern, RequestParts, RouteTable};
use fencegate::token::{parse_fence_token, read_fence_header};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Version};

/// Keys preloaded into the mark cache: the shipped default capacity.
const CACHE_KEYS: usize = fencegate::config::DEFAULT_CACHE_CAPACITY;

fn tokens(c: &mut Criterion) {
    c.bench_function("token/parse_6_digits", |b| {
        b.iter(|| parse_fence_token(black_box(b"314159")))
    });
    c.bench_function("token/parse_u64_max", |b| {
        b.iter(|| parse_fence_token(black_box(b"18446744073709551615")))
    });
    c.bench_function("token/parse_invalid", |b| {
        b.iter(|| parse_fence_token(black_box(b"12,13")))
    });
    let name = HeaderName::from_static("x-fence");
    let headers = request_headers();
    c.bench_function("token/read_header", |b| {
        b.iter(|| read_fence_header(black_box(&headers), &name))
    });
}

/// A configuration with 20 routes; the last ones are the ones the benchmark hits.
fn route_table() -> RouteTable {
    let mut toml = String::from("[server]\nlisten = \"127.0.0.1:8080\"\n");
    let resources = "accounts orders payments refunds customers products carts shipments returns \
                     coupons reviews tickets users teams projects documents reports webhooks";
    for (i, resource) in resources.split_whitespace().enumerate() {
        let (path, key) = [
            ("/api/v1/R/{id}", "R:{id}"),
            ("/api/v1/R/{id}/items/{item}", "R:{id}:{item}"),
            ("/api/v1/tenants/{tenant}/R/{id}", "R:{tenant}:{id}"),
        ][i % 3];
        let (path, key) = (path.replace('R', resource), key.replace('R', resource));
        toml.push_str(&format!(
            "[[routes]]\nname = \"{resource}\"\npath = \"{path}\"\n\
             upstream = \"http://127.0.0.1:9000\"\nresource_key = \"{key}\"\n"
        ));
    }
    toml.push_str(
        "[[routes]]\nname = \"invoices\"\npath = \"/invoices/{id}\"\n\
         upstream = \"http://127.0.0.1:9000\"\nresource_key = \"invoice:{id}\"\n\
         [[routes]]\nname = \"files\"\npath = \"/files/{*rest}\"\n\
         upstream = \"http://127.0.0.1:9001\"\nresource_key = \"file:{rest}\"\n",
    );
    let config = fencegate::config::parse_str(&toml, Path::new("hot_path.toml"))
        .expect("the benchmark configuration is valid");
    assert_eq!(config.routes.len(), 20);
    RouteTable::compile(&config.routes).expect("the benchmark routes compile")
}

fn routes(c: &mut Criterion) {
    let table = route_table();
    let find = |path: &str| {
        let canonical = canonicalize(path).expect("a canonical path");
        table
            .find(&canonical, &Method::PUT)
            .map(|found| found.is_some())
    };
    assert_eq!(find("/invoices/123456"), Ok(true));
    assert_eq!(find("/api/v2/nothing/here"), Ok(false));
    // What the routing layer does per request: canonicalise, then match.
    c.bench_function("route/find_hit_19_of_20", |b| {
        b.iter(|| find(black_box("/invoices/123456")))
    });
    c.bench_function("route/find_miss", |b| {
        b.iter(|| find(black_box("/api/v2/nothing/here")))
    });
}

fn keys(c: &mut Criterion) {
    let pattern = PathPattern::parse("/invoices/{id}").unwrap();
    let canonical = canonicalize("/invoices/123456").unwrap();
    let captures = pattern
        .match_path(&canonical, false)
        .unwrap()
        .unwrap()
        .captures;
    let headers = request_headers();
    let request = RequestParts {
        captures: &captures,
        headers: &headers,
        query: Some("draft=1"),
        body: None,
    };
    let plain = KeyTemplate::parse("invoice:{id}", pattern.param_names()).unwrap();
    let tenant = KeyTemplate::parse(
        "tenant:{header:X-Tenant}:invoice:{id}",
        pattern.param_names(),
    )
    .unwrap();
    assert_eq!(plain.render(&request).unwrap(), "invoice:123456");
    assert_eq!(
        tenant.render(&request).unwrap(),
        "tenant:acme:invoice:123456"
    );
    c.bench_function("key/render_segment", |b| {
        b.iter(|| plain.render(black_box(&request)))
    });
    c.bench_function("key/render_header_and_segment", |b| {
        b.iter(|| tenant.render(black_box(&request)))
    });
}

fn cache(c: &mut Criterion) {
    let cache = MarkCache::new(CACHE_KEYS);
    for i in 0..CACHE_KEYS {
        cache.raise(&format!("invoice:{i}"), 1_000);
    }
    assert_eq!(
        cache.refuses("invoice:4242", 999, Compare::Monotonic),
        Some(1_000)
    );
    c.bench_function("cache/refuses_hit", |b| {
        b.iter(|| {
            cache.refuses(
                black_box("invoice:4242"),
                black_box(999),
                Compare::Monotonic,
            )
        })
    });
    c.bench_function("cache/refuses_miss", |b| {
        b.iter(|| {
            cache.refuses(
                black_box("unknown:4242"),
                black_box(999),
                Compare::Monotonic,
            )
        })
    });
    let mut mark = 1_000;
    c.bench_function("cache/raise_cached_key", |b| {
        b.iter(|| {
            mark += 1;
            cache.raise(black_box("invoice:4242"), mark);
        })
    });
    let mut next = 0u64;
    c.bench_function("cache/raise_new_key_evicting", |b| {
        b.iter_batched(
            || {
                next += 1;
                format!("new:{next}")
            },
            |key| {
                cache.raise(black_box(&key), 1);
                key
            },
            BatchSize::SmallInput,
        )
    });
}

/// A realistic client request: 12 fields, four of them hop-by-hop or client-claimed forwarding.
fn request_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("host", "api.example.com"),
        ("user-agent", "ledger-client/2.3.1 (linux; x86_64)"),
        ("accept", "application/json"),
        ("accept-encoding", "gzip, br"),
        ("content-type", "application/json"),
        ("content-length", "184"),
        (
            "authorization",
            "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJsZWRnZXIifQ.c2ln",
        ),
        ("x-fence", "314159"),
        ("x-tenant", "acme"),
        ("connection", "keep-alive, x-debug-hop"),
        ("keep-alive", "timeout=5"),
        ("x-forwarded-for", "10.9.8.7"),
    ] {
        headers.append(name, HeaderValue::from_static(value));
    }
    headers
}

fn headers(c: &mut Criterion) {
    let template = request_headers();
    let client = ClientNode::new(IpAddr::from([192, 0, 2, 33]));
    let host = HeaderValue::from_static("api.example.com");
    let hop = ForwardedFor {
        client: &client,
        host: Some(&host),
        proto: "http",
    };
    c.bench_function("headers/strip_via_forwarded", |b| {
        b.iter_batched_ref(
            || template.clone(),
            |headers| {
                strip_hop_by_hop_headers(headers);
                append_via(headers, Version::HTTP_11);
                append_forwarded_headers(headers, &hop, false);
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, tokens, routes, keys, cache, headers);
criterion_main!(benches);
