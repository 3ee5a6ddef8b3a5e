//! TLS against real TLS peers: `https://` upstreams verified with a private CA (and refused,
//! with the reason, when expired, unknown or misnamed), HTTP/2 by ALPN and connection reuse,
//! client certificates both ways, the TLS listener (framing checks on the decrypted bytes,
//! handshake timeout, reload of its certificate without dropping connections), credentials
//! injected from the environment, and check-config's reading of every TLS file.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::admin_api::AdminApi;
use crate::support::gateway::TestGateway;
use crate::support::tls::{
    client_config, connect, https_get, https_send, server_config, write, Leaf, TestCa, TlsUpstream,
};

const LOCAL: &[&str] = &["localhost", "127.0.0.1"];

fn route(upstream: &str, tls_table: &str) -> String {
    format!(
        "[[routes]]\nname = \"charges\"\npath = \"/v1/{{*rest}}\"\nupstream = \"{upstream}\"\nresource_key = \"charge:{{rest}}\"\ncollection_writes = \"allow\"\n\n[routes.fence]\nmode = \"off\"\n\n{tls_table}\n"
    )
}

fn ca_table(ca: &Path) -> String {
    format!("[routes.upstream_tls]\nca_file = \"{}\"\n", ca.display())
}

async fn get(gw: &TestGateway, path: &str) -> crate::support::client::Reply {
    crate::support::client::send("GET", &gw.url(path), &[], "").await
}

#[tokio::test]
async fn an_https_upstream_is_verified_with_the_route_ca_and_its_connections_are_reused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let upstream = TlsUpstream::start(server_config(&ca.leaf(LOCAL), None, &[b"http/1.1"])).await;
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let gw = TestGateway::start(&route(&upstream.url(), &ca_table(&ca_file))).await;
    for _ in 0..3 {
        let reply = get(&gw, "/v1/charges").await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(&reply.body[..], b"charged");
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.version == http::Version::HTTP_11));
    assert_eq!(seen[0].target, "/v1/charges");
    assert!(seen.iter().all(|s| s.uri == "/v1/charges"), "{seen:?}");
    // One serving thread per core may open its own connection; three requests one after
    // another on a kept-alive pool need at most one per thread, not one per request.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        upstream.connections() <= threads.min(2),
        "{} TLS connections for 3 sequential requests",
        upstream.connections()
    );
}

#[tokio::test]
async fn http2_is_used_when_the_upstream_offers_it_by_alpn() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let upstream =
        TlsUpstream::start(server_config(&ca.leaf(LOCAL), None, &[b"h2", b"http/1.1"])).await;
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let gw = TestGateway::start(&route(&upstream.url(), &ca_table(&ca_file))).await;
    for _ in 0..4 {
        let reply = get(&gw, "/v1/charges?n=1").await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 4);
    assert!(seen.iter().all(|s| s.version == http::Version::HTTP_2));
    let authority = upstream.addr.to_string();
    let absolute = format!("https://{authority}/v1/charges?n=1");
    assert!(seen.iter().all(|s| s.uri == absolute), "{seen:?}");
    assert!(seen.iter().all(|s| s
        .headers
        .get("host")
        .is_some_and(|h| h == authority.as_str())));
    // An HTTP/2 connection is shared: one per serving thread at most, not one per request.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        upstream.connections() <= threads.min(2),
        "{} TLS connections for 4 sequential requests",
        upstream.connections()
    );
}

/// The 502 a route answers when its upstream presents `leaf`, and the problem's detail.
async fn refusal_for(leaf: Leaf, trusted_ca: &str, extra: &str) -> (u16, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let upstream = TlsUpstream::start(server_config(&leaf, None, &[b"http/1.1"])).await;
    let ca_file = write(dir.path(), "ca.pem", trusted_ca);
    let table = format!("{}{extra}", ca_table(&ca_file));
    let gw = TestGateway::start(&route(&upstream.url(), &table)).await;
    let reply = get(&gw, "/v1/charges").await;
    let detail = if reply.status == 200 {
        String::new()
    } else {
        reply.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let slug = if reply.status == 200 {
        String::new()
    } else {
        reply.problem_slug()
    };
    assert!(upstream.seen().is_empty() || reply.status == 200);
    (reply.status.as_u16(), slug, detail)
}

#[tokio::test]
async fn a_certificate_that_fails_verification_is_a_502_that_says_why() {
    let ca = TestCa::new("test CA");
    let other = TestCa::new("someone else's CA");

    let (status, slug, detail) = refusal_for(ca.expired_leaf(LOCAL), &ca.pem, "").await;
    assert_eq!((status, slug.as_str()), (502, "upstream-tls"));
    assert!(detail.contains("expired"), "{detail}");

    let (status, slug, detail) = refusal_for(other.leaf(LOCAL), &ca.pem, "").await;
    assert_eq!((status, slug.as_str()), (502, "upstream-tls"));
    assert!(detail.contains("unknown issuer"), "{detail}");

    let (status, slug, detail) = refusal_for(ca.leaf(&["api.example.com"]), &ca.pem, "").await;
    assert_eq!((status, slug.as_str()), (502, "upstream-tls"));
    assert!(detail.contains("name mismatch"), "{detail}");

    // The same certificate passes when the route names the host it was issued for.
    let (status, _, _) = refusal_for(
        ca.leaf(&["api.example.com"]),
        &ca.pem,
        "server_name = \"api.example.com\"\n",
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_bundled_web_roots_do_not_trust_a_private_ca() {
    let ca = TestCa::new("test CA");
    let upstream = TlsUpstream::start(server_config(&ca.leaf(LOCAL), None, &[b"http/1.1"])).await;
    let gw = TestGateway::start(&route(&upstream.url(), "")).await;
    let reply = get(&gw, "/v1/charges").await;
    assert_eq!(reply.status, 502);
    assert_eq!(reply.problem_slug(), "upstream-tls");
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn a_client_certificate_is_presented_to_an_upstream_that_requires_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let clients = TestCa::new("client CA");
    let upstream = TlsUpstream::start(server_config(
        &ca.leaf(LOCAL),
        Some(&clients.pem),
        &[b"http/1.1"],
    ))
    .await;
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let without = TestGateway::start(&route(&upstream.url(), &ca_table(&ca_file))).await;
    let reply = get(&without, "/v1/charges").await;
    assert_eq!(reply.status, 502, "{:?}", reply.body);
    assert_eq!(reply.problem_slug(), "upstream-tls");

    let (cert, key) = clients
        .leaf(&["gateway.internal"])
        .write(dir.path(), "client");
    let table = format!(
        "{}client_cert = \"{}\"\nclient_key = \"{}\"\n",
        ca_table(&ca_file),
        cert.display(),
        key.display()
    );
    let with = TestGateway::start(&route(&upstream.url(), &table)).await;
    let reply = get(&with, "/v1/charges").await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(upstream.seen().len(), 1);
}

#[tokio::test]
async fn credentials_come_from_the_environment_and_response_headers_are_stripped() {
    std::env::set_var("FENCEGATE_TEST_PROVIDER_SECRET", "sk_live_from_env");
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let upstream = TlsUpstream::start(server_config(&ca.leaf(LOCAL), None, &[b"http/1.1"])).await;
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    let routes = format!(
        "[[routes]]\nname = \"charges\"\npath = \"/v1/{{*rest}}\"\nupstream = \"{}\"\nresource_key = \"charge:{{rest}}\"\ncollection_writes = \"allow\"\nstrip_response_headers = [\"X-Upstream-Secret\"]\n\n[routes.fence]\nmode = \"off\"\n\n{}\n[routes.upstream_headers]\nAuthorization = \"Bearer ${{FENCEGATE_TEST_PROVIDER_SECRET}}\"\n",
        upstream.url(),
        ca_table(&ca_file)
    );
    let gw = TestGateway::start(&routes).await;
    let reply = crate::support::client::send(
        "POST",
        &gw.url("/v1/charges"),
        &[("authorization", "Bearer client-must-not-decide")],
        "amount=100",
    )
    .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.header("x-upstream-secret"), None);
    let seen = upstream.seen();
    assert_eq!(
        seen[0].headers.get("authorization").unwrap(),
        "Bearer sk_live_from_env"
    );
    assert_eq!(seen[0].headers.get_all("authorization").iter().count(), 1);
    // The compiled route never prints the value.
    assert!(!format!("{:?}", gw.route("charges")).contains("sk_live_from_env"));
}

/// A gateway with `[server.tls]` from `leaf` (and `client_ca`), in front of a plain upstream.
async fn tls_gateway(
    dir: &Path,
    leaf: &Leaf,
    extra: &str,
) -> (TestGateway, crate::support::upstream::RecordingUpstream) {
    let upstream =
        crate::support::upstream::RecordingUpstream::start(crate::support::upstream::Behavior::Ok)
            .await;
    let (cert, key) = leaf.write(dir, "listener");
    let tables = format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\nhandshake_timeout = \"300ms\"\n{extra}",
        cert.display(),
        key.display()
    );
    let routes =
        crate::support::gateway::fenced_route("inv", &upstream.url(), "enforce", "monotonic");
    let gw = TestGateway::builder(&routes)
        .server_tables(&tables)
        .admin("admin-token-0123456789")
        .config_file()
        .start()
        .await;
    (gw, upstream)
}

fn https_url(gw: &TestGateway, path: &str) -> String {
    format!("https://localhost:{}{path}", gw.addr.port())
}

#[tokio::test]
async fn the_listener_speaks_tls_with_http1_and_http2_and_says_so_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let (gw, upstream) = tls_gateway(dir.path(), &ca.leaf(LOCAL), "").await;
    for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
        let reply = https_send(
            client_config(&ca.pem, None, &[alpn]),
            "PUT",
            &https_url(&gw, "/inv/7"),
            &[("x-fence", "1")],
            "",
        )
        .await
        .unwrap_or_else(|e| panic!("{alpn:?}: {e}"));
        assert_eq!(reply.status, 200, "{alpn:?}: {:?}", reply.body);
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("x-forwarded-proto"), Some("https"));
    assert!(seen[0]
        .header("forwarded")
        .is_some_and(|f| f.contains("proto=https")));
    // Plain HTTP to a TLS listener gets no HTTP answer.
    assert!(
        crate::support::client::try_send("GET", &gw.url("/inv/7"), &[], "")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn framing_checks_read_the_decrypted_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let (gw, upstream) = tls_gateway(dir.path(), &ca.leaf(LOCAL), "").await;
    let mut tls = connect(gw.addr, &ca.pem).await;
    tls.write_all(
        b"PUT /inv/1 HTTP/1.1\r\nHost: x\r\nX-Fence: 1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("ambiguous-framing"), "{text}");
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn a_client_that_never_completes_its_handshake_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let (gw, _upstream) = tls_gateway(dir.path(), &ca.leaf(LOCAL), "").await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let mut buf = [0u8; 16];
    // handshake_timeout is 300 ms; the bound here only keeps a broken gateway from hanging the test.
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection was not closed: {read:?}"
    );
}

#[tokio::test]
async fn client_certificates_are_required_when_client_ca_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let clients = TestCa::new("client CA");
    let client_ca = write(dir.path(), "clients.pem", &clients.pem);
    let (gw, _upstream) = tls_gateway(
        dir.path(),
        &ca.leaf(LOCAL),
        &format!("client_ca = \"{}\"\n", client_ca.display()),
    )
    .await;
    let url = https_url(&gw, "/inv/7");
    let refused = https_get(&ca.pem, None, &url).await;
    assert!(
        refused.is_err(),
        "answered without a client certificate: {refused:?}"
    );
    let stranger = TestCa::new("stranger").leaf(&["intruder"]);
    let refused = https_get(&ca.pem, Some(&stranger), &url).await;
    assert!(
        refused.is_err(),
        "answered a certificate of another CA: {refused:?}"
    );
    let reply = https_get(&ca.pem, Some(&clients.leaf(&["service-a"])), &url)
        .await
        .expect("a client with a certificate from client_ca is served");
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn reload_swaps_the_certificate_without_dropping_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = TestCa::new("old CA");
    let new_ca = TestCa::new("new CA");
    let (gw, _upstream) = tls_gateway(dir.path(), &old_ca.leaf(LOCAL), "").await;

    // A kept-alive connection made with the old certificate.
    let mut open = connect(gw.addr, &old_ca.pem).await;
    let request = b"GET /inv/1 HTTP/1.1\r\nHost: localhost\r\n\r\n";
    open.write_all(request).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = open.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));

    new_ca.leaf(LOCAL).write(dir.path(), "listener");
    let reload = crate::support::client::send(
        "POST",
        &gw.admin_url("/admin/reload"),
        &[("authorization", "Bearer admin-token-0123456789")],
        "",
    )
    .await;
    assert_eq!(reload.status, 200, "{:?}", reload.body);
    assert_eq!(reload.json()["certificates"], 1);

    // New connections get the new certificate.
    let url = https_url(&gw, "/inv/1");
    let new = https_get(&new_ca.pem, None, &url).await;
    assert_eq!(new.expect("the new certificate is served").status, 200);
    let old = https_get(&old_ca.pem, None, &url).await;
    assert!(
        old.is_err(),
        "the old certificate is still served to new connections"
    );
    // The connection opened before the reload still works.
    open.write_all(request).await.unwrap();
    let n = open.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );

    // A reload with a broken key keeps the certificate in force and says so.
    std::fs::write(dir.path().join("listener.key"), "not a key").unwrap();
    let reload = crate::support::client::send(
        "POST",
        &gw.admin_url("/admin/reload"),
        &[("authorization", "Bearer admin-token-0123456789")],
        "",
    )
    .await;
    assert_ne!(reload.status, 200);
    assert!(
        String::from_utf8_lossy(&reload.body).contains("listener.key"),
        "{:?}",
        reload.body
    );
    let still = https_get(&new_ca.pem, None, &url).await;
    assert_eq!(still.expect("the previous certificate stays").status, 200);
}

/// `fencegate_certificate_expiry_timestamp_seconds` of `certificate` on `gw`'s admin listener.
async fn certificate_expiry(gw: &TestGateway, certificate: &str) -> Option<f64> {
    let exposition = AdminApi::of(gw, "admin-token-0123456789").metrics().await;
    crate::support::admin_api::metric(
        &exposition,
        &format!("fencegate_certificate_expiry_timestamp_seconds{{certificate=\"{certificate}\"}}"),
    )
}

#[tokio::test]
async fn certificate_expiry_is_exported_for_the_listener_and_upstream_clients_and_follows_reloads()
{
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    let (listener_until, client_until, renewed_until) =
        (now + 10 * 86_400, now + 20 * 86_400, now + 90 * 86_400);
    let (cert, key) = ca
        .leaf_until(&["gateway.internal"], client_until)
        .write(dir.path(), "client");
    let client_route = format!(
        "[[routes]]\nname = \"charges\"\npath = \"/v1/{{*rest}}\"\nupstream = \"https://127.0.0.1:9\"\nresource_key = \"charge:{{rest}}\"\ncollection_writes = \"allow\"\n\n[routes.fence]\nmode = \"off\"\n\n[routes.upstream_tls]\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let (cert, key) = ca
        .leaf_until(LOCAL, listener_until)
        .write(dir.path(), "listener");
    let routes = format!(
        "{}{client_route}",
        crate::support::gateway::fenced_route("inv", "http://127.0.0.1:9", "enforce", "monotonic")
    );
    let gw = TestGateway::builder(&routes)
        .server_tables(&format!(
            "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        ))
        .admin("admin-token-0123456789")
        .config_file()
        .start()
        .await;
    assert_eq!(
        certificate_expiry(&gw, "server").await,
        Some(listener_until as f64)
    );
    assert_eq!(
        certificate_expiry(&gw, "upstream:charges").await,
        Some(client_until as f64)
    );
    assert_eq!(certificate_expiry(&gw, "upstream:inv").await, None);
    assert_eq!(certificate_expiry(&gw, "admin").await, None, "plain HTTP");

    // A renewed certificate, reloaded: the gauge follows.
    ca.leaf_until(LOCAL, renewed_until)
        .write(dir.path(), "listener");
    let reload = AdminApi::of(&gw, "admin-token-0123456789").reload().await;
    assert_eq!(reload.status, 200, "{:?}", reload.body);
    assert_eq!(
        certificate_expiry(&gw, "server").await,
        Some(renewed_until as f64)
    );
}

#[tokio::test]
async fn the_admin_listener_speaks_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let (cert, key) = ca.leaf(LOCAL).write(dir.path(), "admin");
    let admin = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"admin-token-0123456789\"\n\n[admin.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let upstream =
        crate::support::upstream::RecordingUpstream::start(crate::support::upstream::Behavior::Ok)
            .await;
    let gw = TestGateway::builder(&crate::support::gateway::fenced_route(
        "inv",
        &upstream.url(),
        "enforce",
        "monotonic",
    ))
    .admin_toml(&admin)
    .start()
    .await;
    let port = gw.admin.expect("admin listener").port();
    let reply = https_get(&ca.pem, None, &format!("https://localhost:{port}/healthz"))
        .await
        .expect("admin over TLS");
    assert_eq!(reply.status, 200);
    assert!(crate::support::client::try_send(
        "GET",
        &format!("http://127.0.0.1:{port}/healthz"),
        &[],
        ""
    )
    .await
    .is_err());
}

/// `check-config`'s answer (through the same compile step `serve` uses) for `[server.tls]`.
fn check(dir: &Path, tls: &str) -> Result<(), String> {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"{}\"\n\n{tls}\n",
        dir.display()
    );
    fencegate::Compiled::parse(&text, Path::new("tls.toml"))
        .map(drop)
        .map_err(|e| e.to_string())
}

#[test]
fn check_config_reads_every_tls_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test CA");
    let (cert, key) = ca.leaf(LOCAL).write(dir.path(), "good");
    let (_, other_key) = ca.leaf(LOCAL).write(dir.path(), "other");
    let not_pem = write(dir.path(), "junk.pem", "hello");
    let table = |cert: &Path, key: &Path| {
        format!(
            "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        )
    };
    assert_eq!(check(dir.path(), &table(&cert, &key)), Ok(()));

    let missing = check(dir.path(), &table(&dir.path().join("nope.crt"), &key)).unwrap_err();
    assert!(
        missing.contains("server.tls.cert") && missing.contains("nope.crt"),
        "{missing}"
    );
    let junk = check(dir.path(), &table(&not_pem, &key)).unwrap_err();
    assert!(
        junk.contains("junk.pem") && junk.contains("no CERTIFICATE"),
        "{junk}"
    );
    let mismatch = check(dir.path(), &table(&cert, &other_key)).unwrap_err();
    assert!(
        mismatch.contains("server.tls.key") && mismatch.contains("does not belong"),
        "{mismatch}"
    );
    let bad_ca = check(
        dir.path(),
        &format!(
            "{}client_ca = \"{}\"\n",
            table(&cert, &key),
            not_pem.display()
        ),
    )
    .unwrap_err();
    assert!(bad_ca.contains("client_ca"), "{bad_ca}");

    // A route's upstream TLS: files, names and pairing are checked the same way.
    let route = |upstream: &str, table: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"{}\"\n\n{}",
            dir.path().display(),
            route(upstream, table)
        )
    };
    let compile = |text: String| {
        fencegate::Compiled::parse(&text, Path::new("tls.toml"))
            .map(drop)
            .map_err(|e| e.to_string())
    };
    let http_with_tls = compile(route("http://127.0.0.1:1", &ca_table(&cert))).unwrap_err();
    assert!(
        http_with_tls.contains("needs an https:// upstream"),
        "{http_with_tls}"
    );
    let junk_ca = compile(route("https://127.0.0.1:1", &ca_table(&not_pem))).unwrap_err();
    assert!(junk_ca.contains("upstream_tls.ca_file"), "{junk_ca}");
    let half = compile(route(
        "https://127.0.0.1:1",
        &format!(
            "[routes.upstream_tls]\nclient_cert = \"{}\"\n",
            cert.display()
        ),
    ))
    .unwrap_err();
    assert!(half.contains("set both or neither"), "{half}");
    let pair = compile(route(
        "https://127.0.0.1:1",
        &format!(
            "[routes.upstream_tls]\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
            cert.display(),
            other_key.display()
        ),
    ))
    .unwrap_err();
    assert!(pair.contains("does not belong"), "{pair}");
    let name = compile(route(
        "https://127.0.0.1:1",
        "[routes.upstream_tls]\nserver_name = \"not a name!\"\n",
    ))
    .unwrap_err();
    assert!(name.contains("server_name"), "{name}");
    assert_eq!(
        compile(route("https://127.0.0.1:1", &ca_table(&cert))),
        Ok(())
    );
}
