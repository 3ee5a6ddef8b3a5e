//! Differential tests against real, unmodified upstream frameworks (Flask/Werkzeug, Django,
//! Express, Go's net/http, Rails, Spring MVC, nginx WebDAV): every way of spelling a write that
//! we know of — methods, paths, queries, headers, hosts, WebDAV destinations, and ids the
//! framework parses as integers or UUIDs — is sent through the gateway, and each
//! framework's own record of what it applied is checked. For every variant, either the gateway
//! refused it, or the framework applied it to a resource whose key the gateway fenced with that
//! very token. With the marks of the fenced keys at 10 and the variants carrying 5, that means no
//! stale write is applied, however the framework reads the request.

mod support;

use std::fmt::Write as _;
use std::net::SocketAddr;

use support::client::try_send_h2;
use support::frameworks::{Applied, Framework, FrameworkUpstream};
use support::raw::exchange;
use support::{send, TestGateway};

/// The mark every fenced key is claimed at before the stale variants.
const MARK: u64 = 10;
/// The stale holder's token.
const STALE: u64 = 5;
/// Tokens of the fresh pass start here and grow by one per variant.
const FRESH_BASE: u64 = 1000;

/// The resources the fenced routes below name, in the frameworks' spelling: a write applied to
/// one of them must have been fenced under exactly that key.
const FENCED_PREFIXES: [&str; 12] = [
    "invoice:",
    "acct:",
    "doc:",
    "file:",
    "order:",
    "parcel:",
    "ticket:",
    "badge:",
    "ledger:",
    "tally:",
    "shipment:",
    "crate:",
];

/// The id the typed-id resources are written as, and the one UUID (it starts with a letter, so
/// its canonical form passes the untyped rule).
const INT_ID: &str = "42";
const UUID_ID: &str = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";

/// One way of sending a write.
#[derive(Debug, Clone)]
struct Variant {
    name: String,
    method: String,
    target: String,
    /// Headers besides `X-Fence` and `Content-Length`; a `Host` here replaces the default one.
    headers: Vec<(String, String)>,
    h2: bool,
}

/// What the resource under test is called on one framework.
struct Shape {
    /// `/invoices/1` spelled as `{pre}{lit}/{id}`: `pre` the directory above, `lit` the fenced
    /// route's last literal, `id` the captured segment.
    pre: &'static str,
    lit: &'static str,
    id: &'static str,
    /// An unfenced path to MOVE or COPY from.
    source: &'static str,
    /// Query and header variants apply (the app frameworks have `/accounts` and `/docs`).
    keyed_inputs: bool,
}

const APP_SHAPE: Shape = Shape {
    pre: "/",
    lit: "invoices",
    id: "1",
    source: "/other/src",
    keyed_inputs: true,
};

const DAV_SHAPE: Shape = Shape {
    pre: "/files/",
    lit: "ledger",
    id: "acct1",
    source: "/files/public/src",
    keyed_inputs: false,
};

fn variant(name: &str, method: &str, target: &str, headers: &[(&str, &str)]) -> Variant {
    Variant {
        name: name.to_owned(),
        method: method.to_owned(),
        target: target.to_owned(),
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        h2: false,
    }
}

/// Every variant for one framework shape; `host` is the gateway's address as clients name it.
fn variants(shape: &Shape, host: &str) -> Vec<Variant> {
    let Shape {
        pre,
        lit,
        id,
        source,
        ..
    } = shape;
    let hex = |c: u8| format!("%{c:02X}");
    let (lit_first, lit_rest) = lit.split_at(1);
    let (lit_init, lit_last) = lit.split_at(lit.len() - 1);
    let (id_first, id_rest) = id.split_at(1);
    let title = format!("{}{lit_rest}", lit_first.to_uppercase());
    let path = |template: &str| {
        template
            .replace("{pre}", pre)
            .replace("{Lit}", &title)
            .replace("{LIT}", &lit.to_uppercase())
            .replace(
                "{lit%first}",
                &format!("{}{lit_rest}", hex(lit_first.as_bytes()[0])),
            )
            .replace(
                "{lit%last}",
                &format!("{lit_init}{}", hex(lit_last.as_bytes()[0])),
            )
            .replace(
                "{id%first}",
                &format!("{}{id_rest}", hex(id_first.as_bytes()[0])),
            )
            .replace(
                "{id%digits}",
                &format!("{:02X}{id_rest}", id_first.as_bytes()[0]),
            )
            .replace("{lit}", lit)
            .replace("{id}", id)
    };
    let base = path("{pre}{lit}/{id}");
    let mut all = Vec::new();
    for method in [
        "PUT",
        "put",
        "Put",
        "post",
        "PoSt",
        "delete",
        "PATCH",
        "patch",
        "MOVE",
        "move",
        "COPY",
        "MERGE",
        "PROPPATCH",
        "LOCK",
        "MKCOL",
        "FOO",
        "get",
        "options",
    ] {
        all.push(variant(&format!("method {method}"), method, &base, &[]));
    }
    for method in ["PUT", "put", "MOVE", "post"] {
        let mut h2 = variant(&format!("h2 :method {method}"), method, &base, &[]);
        h2.h2 = true;
        all.push(h2);
    }
    all.push(variant("CONNECT", "CONNECT", host, &[]));
    for template in [
        "/{pre}{lit}/{id}",
        "{pre}{lit}//{id}",
        "{pre}{lit}/{id}/",
        "{pre}{lit}/{id}//",
        "///{pre}{lit}///{id}//",
        "{pre}{Lit}/{id}",
        "{pre}{LIT}/{id}/",
        "{pre}{lit%first}/{id}",
        "{pre}{lit%last}/{id}",
        "{pre}{lit}/{id%first}",
        "{pre}{lit};x/{id}",
        "{pre}{lit}/{id};x=y",
        "{pre}{lit}/;x",
        "{pre}public/..;/{lit}/{id}",
        "{pre}public/../{lit}/{id}",
        "{pre}public/%2e%2e/{lit}/{id}",
        "{pre}./{lit}/{id}",
        "{pre}{lit}/./{id}",
        "{pre}{lit}/{id}%2F",
        "{pre}{lit}%2F{id}",
        "{pre}%2F{lit}/{id}",
        "{pre}{lit}/%25{id%digits}",
        "{pre}{lit}/{id}%00",
        "{pre}{lit}/{id}?",
        "{pre}{lit}/{id}%3B",
    ] {
        let target = path(template);
        all.push(variant(&format!("path {target}"), "PUT", &target, &[]));
    }
    for authority in [host.to_owned(), host.to_uppercase()] {
        let target = format!("http://{authority}/{}", base.trim_start_matches('/'));
        all.push(variant(&format!("absolute {target}"), "PUT", &target, &[]));
        let doubled = format!("http://{authority}/{base}");
        all.push(variant(
            &format!("absolute {doubled}"),
            "PUT",
            &doubled,
            &[],
        ));
    }
    // Hosts.
    let other = format!("http://other.example{base}");
    all.push(variant(
        "absolute-form, another authority than Host",
        "PUT",
        &other,
        &[],
    ));
    all.push(variant(
        "two Host headers",
        "PUT",
        &base,
        &[("Host", host), ("Host", "other.example")],
    ));
    all.push(variant("no Host header", "PUT", &base, &[("Host", "")]));
    // WebDAV destinations, from an unfenced path onto the fenced resource.
    let canonical = base.clone();
    for destination in [
        canonical.clone(),
        format!("http://{host}{canonical}"),
        format!("http://{host}/{canonical}"),
        path("{pre}{lit}//{id}"),
        path("{pre}{Lit}/{id}/"),
        path("{pre}{LIT}/{id}"),
        path("{pre}{lit%first}/{id}"),
        path("{pre}public/../{lit}/{id}"),
        path("/{pre}{lit}/{id}"),
    ] {
        for method in ["MOVE", "COPY"] {
            all.push(variant(
                &format!("{method} {source} -> {destination}"),
                method,
                source,
                &[("Destination", &destination)],
            ));
        }
    }
    // Collections holding the fenced resource: deleting or moving them, or writing onto them.
    for target in [
        path("{pre}{lit}/"),
        path("{pre}{lit}"),
        path("{pre}{Lit}//"),
    ] {
        all.push(variant(
            &format!("DELETE collection {target}"),
            "DELETE",
            &target,
            &[],
        ));
        all.push(variant(
            &format!("MOVE collection {target}"),
            "MOVE",
            &target,
            &[("Destination", &path("{pre}public/gone/"))],
        ));
    }
    for destination in [
        path("{pre}{lit}/"),
        path("{pre}{lit};x/{id}"),
        path("{pre}{lit}/{id};v=1"),
    ] {
        all.push(variant(
            &format!("COPY {source} -> {destination}"),
            "COPY",
            source,
            &[("Destination", &destination), ("Overwrite", "T")],
        ));
    }
    // Other ways of naming another path or method than the request line's.
    all.push(variant(
        "X-Original-URL onto the fenced path",
        "PUT",
        &path("{pre}public/x"),
        &[("X-Original-URL", &base), ("X-Rewrite-URL", &base)],
    ));
    all.push(variant(
        "X-HTTP-Method-Override",
        "POST",
        &base,
        &[("X-HTTP-Method-Override", "PUT")],
    ));
    all.push(variant(
        "format suffix .json",
        "PUT",
        &format!("{base}.json"),
        &[],
    ));
    // Control: a destination no route fences is forwarded and applied.
    let elsewhere = path("{pre}public/moved");
    all.push(variant(
        &format!("MOVE {source} -> {elsewhere}"),
        "MOVE",
        source,
        &[("Destination", &elsewhere)],
    ));
    all.push(variant(
        "MOVE with two Destinations",
        "MOVE",
        source,
        &[("Destination", "/elsewhere"), ("Destination", &canonical)],
    ));
    if shape.keyed_inputs {
        all.extend(typed_variants());
        for query in [
            "id=7",
            "id=7&id=42",
            "id=42&id=7",
            "id=",
            "id",
            "i%64=7",
            "id=7;id=42",
            "id=7%3Bid=42",
            "id[]=7",
            "id=7&id[]=42",
            "ID=42&id=7",
            "x=1;id=7",
            "id=7&x=1",
            "id=7&+id=42",
            "id=7&[id]=42",
            "id=7&id]=42",
            "id=7&id%00=42",
        ] {
            all.push(variant(
                &format!("query ?{query}"),
                "PUT",
                &format!("/accounts?{query}"),
                &[],
            ));
        }
        all.push(variant(
            "form body overriding the query",
            "PUT",
            "/accounts?id=7",
            &[("Content-Type", "application/x-www-form-urlencoded")],
        ));
        all.push(variant(
            "X_Tenant beside X-Tenant",
            "PUT",
            "/docs/1",
            &[("X-Tenant", "acme"), ("X_Tenant", "evil")],
        ));
        for tenant in [
            vec!["acme"],
            vec!["acme", "evil"],
            vec!["evil", "acme"],
            vec!["acme, evil"],
            vec![""],
        ] {
            let headers: Vec<(&str, &str)> = tenant.iter().map(|t| ("X-Tenant", *t)).collect();
            all.push(variant(
                &format!("header X-Tenant {tenant:?}"),
                "PUT",
                "/docs/1",
                &headers,
            ));
        }
    }
    all
}

/// Spellings of the integer 42 that some framework reads as 42 (or that look like it), as they
/// go into a path segment (percent-encoded where they must be).
const INT_SPELLINGS: [&str; 20] = [
    "42",
    "042",
    "0042",
    "%2B42",
    "-42",
    "%2042",
    "42%20",
    "%0942",
    "4_2",
    "%EF%BC%94%EF%BC%92",
    "0x2A",
    "42abc",
    "4.2e1",
    "42.0",
    "%2342",
    "4%202",
    "42.json",
    // Spring's number conversion removes every blank, anywhere, and reads `#` as hex.
    "%23%202a",
    "%1C42",
    // JavaScript's Number() trims a byte order mark.
    "%EF%BB%BF42",
];

/// Spellings of [`UUID_ID`] (and one of Java's short forms), as they go into a path segment.
fn uuid_spellings() -> Vec<String> {
    let upper = UUID_ID.to_uppercase();
    let bare = UUID_ID.replace('-', "");
    vec![
        UUID_ID.to_owned(),
        upper.clone(),
        format!("%7B{UUID_ID}%7D"),
        bare.clone(),
        bare.to_uppercase(),
        format!("urn:uuid:{UUID_ID}"),
        format!("%20{UUID_ID}"),
        // PostgreSQL reads a hyphen after any group of four digits.
        "a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11".to_owned(),
        // Java's UUID.fromString reads five hex fields of any width.
        "a0eebc99-9c0b-4ef8-bb6d-00006bb9bd380a11".to_owned(),
        "a-b-c-d-e".to_owned(),
        // Spring trims control characters; Python's uuid.UUID reads digits of any script.
        format!("%01{UUID_ID}"),
        "a0eebc99%D9%A9c0b4ef8bb6d6bb9bd380a11".to_owned(),
    ]
}

/// The typed-id families: every spelling of the integer and UUID ids in a path segment, a query
/// parameter and a header, on routes that type them and on routes that leave them untyped.
fn typed_variants() -> Vec<Variant> {
    let mut all = Vec::new();
    let uuids = uuid_spellings();
    let ints: Vec<String> = INT_SPELLINGS.iter().map(|s| (*s).to_owned()).collect();
    for (collection, spellings) in [
        ("orders", &ints),
        ("parcels", &ints),
        ("tickets", &uuids),
        ("badges", &uuids),
    ] {
        for id in spellings.iter() {
            let target = format!("/{collection}/{id}");
            all.push(variant(
                &format!("typed path {target}"),
                "PUT",
                &target,
                &[],
            ));
        }
    }
    // Query values: `+` is a space in a form-encoded query, `%2B` a plus.
    for (collection, spellings) in [("ledgers", &ints), ("tallies", &uuids)] {
        for id in spellings.iter().chain([&"+42".to_owned()]) {
            let target = format!("/{collection}?id={id}");
            all.push(variant(
                &format!("typed query {target}"),
                "PUT",
                &target,
                &[],
            ));
        }
    }
    // Header values, as sent on the wire (decoded): surrounding spaces are the field's own.
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    for (collection, header, spellings) in [
        ("shipments", "X-Shipment", &ints),
        ("crates", "X-Crate", &uuids),
    ] {
        for id in spellings.iter() {
            let value = decode(id);
            if value.chars().any(char::is_control) {
                continue;
            }
            all.push(variant(
                &format!("typed header {header}: {value:?}"),
                "PUT",
                &format!("/{collection}"),
                &[(header, &value)],
            ));
        }
    }
    all
}

/// The gateway's routes in front of `upstream`: fenced resources plus a `mode = "off"`
/// catch-all, as the shipped configuration has them.
fn routes(framework: Framework, upstream: SocketAddr) -> String {
    let fenced = if framework == Framework::NginxDav {
        r#"
[[routes]]
name = "ledger"
path = "/files/ledger/{name}"
upstream = "http://UPSTREAM"
resource_key = "file:{name}"
"#
    } else {
        r#"
[[routes]]
name = "invoices"
path = "/invoices/{id}"
upstream = "http://UPSTREAM"
resource_key = "invoice:{id}"

[[routes]]
name = "accounts"
path = "/accounts"
upstream = "http://UPSTREAM"
resource_key = "acct:{query:id}"

[[routes]]
name = "docs"
path = "/docs/{id}"
upstream = "http://UPSTREAM"
resource_key = "doc:{header:X-Tenant}:{id}"

[[routes]]
name = "orders"
path = "/orders/{id:int}"
upstream = "http://UPSTREAM"
resource_key = "order:{id}"

[[routes]]
name = "parcels"
path = "/parcels/{id}"
upstream = "http://UPSTREAM"
resource_key = "parcel:{id}"

[[routes]]
name = "tickets"
path = "/tickets/{id:uuid}"
upstream = "http://UPSTREAM"
resource_key = "ticket:{id}"

[[routes]]
name = "badges"
path = "/badges/{id}"
upstream = "http://UPSTREAM"
resource_key = "badge:{id}"

[[routes]]
name = "ledgers"
path = "/ledgers"
upstream = "http://UPSTREAM"
resource_key = "ledger:{query:id:int}"

[[routes]]
name = "tallies"
path = "/tallies"
upstream = "http://UPSTREAM"
resource_key = "tally:{query:id}"

[[routes]]
name = "shipments"
path = "/shipments"
upstream = "http://UPSTREAM"
resource_key = "shipment:{header:X-Shipment}"

[[routes]]
name = "crates"
path = "/crates"
upstream = "http://UPSTREAM"
resource_key = "crate:{header:X-Crate:uuid}"
"#
    };
    format!(
        r#"{fenced}
[[routes]]
name = "everything-else"
path = "/{{*rest}}"
upstream = "http://UPSTREAM"
[routes.fence]
mode = "off"
"#
    )
    .replace("UPSTREAM", &upstream.to_string())
}

/// The keys claimed at [`MARK`] before the stale pass.
fn claimed_keys(framework: Framework) -> Vec<String> {
    if framework == Framework::NginxDav {
        return vec!["file:acct1".to_owned()];
    }
    let mut keys: Vec<String> = ["invoice:1", "acct:7", "acct:42", "doc:acme:1", "doc:evil:1"]
        .iter()
        .map(|k| (*k).to_owned())
        .collect();
    for prefix in ["order", "parcel", "ledger", "shipment"] {
        keys.push(format!("{prefix}:{INT_ID}"));
    }
    for prefix in ["ticket", "badge", "tally", "crate"] {
        keys.push(format!("{prefix}:{UUID_ID}"));
    }
    keys
}

/// Sends one variant with `token`: the status, and whether the gateway answered it itself (a
/// problem document).
async fn send_variant(
    gateway: SocketAddr,
    variant: &Variant,
    token: u64,
    body: &str,
) -> (u16, bool) {
    let token = token.to_string();
    if variant.h2 {
        let url = format!("http://{gateway}{}", variant.target);
        let mut headers: Vec<(&str, &str)> = vec![("x-fence", &token)];
        headers.extend(
            variant
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str())),
        );
        // A reset stream or a failed connection is no answer: status 0.
        return match try_send_h2(&variant.method, &url, &headers, body).await {
            Some(reply) => {
                let problem = reply.header("content-type") == Some("application/problem+json");
                (reply.status.as_u16(), problem)
            }
            None => (0, false),
        };
    }
    let mut head = format!("{} {} HTTP/1.1\r\n", variant.method, variant.target);
    let sets_host = variant
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("host"));
    if !sets_host {
        let _ = write!(head, "Host: {gateway}\r\n");
    }
    for (name, value) in &variant.headers {
        // An empty Host stands for "no Host header".
        if !(name.eq_ignore_ascii_case("host") && value.is_empty()) {
            let _ = write!(head, "{name}: {value}\r\n");
        }
    }
    let _ = write!(
        head,
        "X-Fence: {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = exchange(gateway, head.as_bytes()).await;
    let problem = answer
        .text()
        .to_ascii_lowercase()
        .contains("content-type: application/problem+json");
    (answer.status().unwrap_or(0), problem)
}

/// How one variant ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// The gateway answered this status itself (a problem document, or no HTTP answer at all);
    /// nothing was applied.
    Refused(u16),
    /// Forwarded, and the framework applied nothing (its own 404, 405, redirect, ...).
    NotApplied(u16),
    /// Forwarded, and applied only to resources no route fences.
    AppliedUnfenced(Vec<String>),
    /// Forwarded, and applied to resources whose keys the gateway fenced with this token.
    AppliedFenced(Vec<String>),
}

impl Outcome {
    fn label(&self) -> String {
        match self {
            Outcome::Refused(status) => format!("refused {status}"),
            Outcome::NotApplied(status) => format!("forwarded, not applied ({status})"),
            Outcome::AppliedUnfenced(r) => format!("applied to unfenced {}", r.join(",")),
            Outcome::AppliedFenced(r) => format!("applied to fenced {}", r.join(",")),
        }
    }
}

/// Whether a framework's resource is one a fenced route keys.
fn is_fenced(resource: &str) -> bool {
    FENCED_PREFIXES.iter().any(|p| resource.starts_with(p))
}

/// Runs every variant through the gateway to `framework`, once with a stale token and once with
/// fresh ones; returns the report, and panics listing every variant that broke the rule.
async fn differential(framework: Framework) -> String {
    let mut upstream = FrameworkUpstream::start(framework).await;
    let gateway = TestGateway::start(&routes(framework, upstream.addr)).await;
    let host = gateway.addr.to_string();
    for key in claimed_keys(framework) {
        let claim = send(
            "POST",
            &gateway.url(&format!("/_fencegate/claim/{key}")),
            &[("x-fence", &MARK.to_string())],
            "",
        )
        .await;
        assert_eq!(claim.status, 200, "claim {key}");
    }
    if framework == Framework::NginxDav {
        // The fenced file exists from the start, so deleting or overwriting it shows.
        upstream.seed_file("files/ledger/acct1", "initial");
    }
    let shape = if framework == Framework::NginxDav {
        &DAV_SHAPE
    } else {
        &APP_SHAPE
    };
    let all = variants(shape, &host);
    let mut violations = Vec::new();
    let mut outcomes = Vec::new();
    let mut report = String::new();
    let mut tally = std::collections::BTreeMap::<(String, &str), usize>::new();
    let _ = writeln!(report, "## {} ({} variants)", framework.name(), all.len());
    for (pass, stale) in [("stale", true), ("fresh", false)] {
        for (i, variant) in all.iter().enumerate() {
            let token = if stale { STALE } else { FRESH_BASE + i as u64 };
            if framework == Framework::NginxDav {
                upstream.seed_file("files/public/src", "seed");
            }
            let _ = upstream.applied_since().await;
            // nginx refuses MOVE, COPY, MKCOL and DELETE with a body (415).
            let bodiless = ["MOVE", "COPY", "MKCOL", "DELETE"]
                .iter()
                .any(|m| m.eq_ignore_ascii_case(&variant.method));
            let body = if bodiless {
                String::new()
            } else {
                format!("{pass} {i} fence={token}")
            };
            let (status, by_gateway) = send_variant(gateway.addr, variant, token, &body).await;
            let applied: Vec<Applied> = upstream.applied_since().await;
            let mut fenced = Vec::new();
            let mut unfenced = Vec::new();
            for write in &applied {
                if !is_fenced(&write.resource) {
                    unfenced.push(write.resource.clone());
                    continue;
                }
                // I1 on the framework's record: the key of the resource it wrote was fenced
                // with this request's token (its mark is this token), so no newer holder's
                // mark was passed over.
                let mark = gateway
                    .store()
                    .current(&write.resource)
                    .await
                    .expect("mark");
                if mark != Some(token) {
                    violations.push(format!(
                        "{pass} {:?}: {} applied {} to {} with token {token}, whose mark is {mark:?}",
                        variant.name,
                        framework.name(),
                        write.method,
                        write.resource
                    ));
                }
                fenced.push(write.resource.clone());
            }
            let outcome = match (fenced.is_empty(), unfenced.is_empty()) {
                (false, _) => Outcome::AppliedFenced(fenced),
                (true, false) => Outcome::AppliedUnfenced(unfenced),
                (true, true) if by_gateway || status == 0 => Outcome::Refused(status),
                (true, true) => Outcome::NotApplied(status),
            };
            let kind = match &outcome {
                Outcome::Refused(_) => "refused",
                Outcome::NotApplied(_) => "forwarded, not applied",
                Outcome::AppliedUnfenced(_) => "applied to an unfenced resource",
                Outcome::AppliedFenced(_) => "applied under its fenced key",
            };
            *tally.entry((pass.to_owned(), kind)).or_default() += 1;
            outcomes.push(outcome.clone());
            let _ = writeln!(
                report,
                "{pass:5} | {:60} | {}",
                variant.name,
                outcome.label()
            );
        }
    }
    // The check must be able to see a write: the plain `PUT` (the first variant) is refused when
    // stale and applied under its key when fresh.
    let key = claimed_keys(framework)[0].clone();
    assert_eq!(
        outcomes[0],
        Outcome::Refused(409),
        "stale plain PUT\n{report}"
    );
    assert_eq!(
        outcomes[all.len()],
        Outcome::AppliedFenced(vec![key]),
        "fresh plain PUT\n{report}"
    );
    let _ = writeln!(report, "totals:");
    for ((pass, kind), count) in &tally {
        let _ = writeln!(report, "  {pass:5} {kind}: {count}");
    }
    eprintln!("{report}");
    assert!(
        violations.is_empty(),
        "{} variants broke the fence:\n{}\n\n{report}",
        violations.len(),
        violations.join("\n")
    );
    report
}

#[tokio::test]
async fn no_stale_write_reaches_flask() {
    differential(Framework::Flask).await;
}

#[tokio::test]
async fn no_stale_write_reaches_django() {
    differential(Framework::Django).await;
}

#[tokio::test]
async fn no_stale_write_reaches_rails() {
    differential(Framework::Rails).await;
}

#[tokio::test]
async fn no_stale_write_reaches_spring_mvc() {
    differential(Framework::SpringMvc).await;
}

#[tokio::test]
async fn no_stale_write_reaches_express() {
    differential(Framework::Express).await;
}

#[tokio::test]
async fn no_stale_write_reaches_go_net_http() {
    differential(Framework::GoNetHttp).await;
}

#[tokio::test]
async fn no_stale_write_reaches_nginx_webdav() {
    differential(Framework::NginxDav).await;
}
