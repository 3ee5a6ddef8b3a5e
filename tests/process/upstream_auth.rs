//! Upstream credentials the gateway obtains itself (`[routes.upstream_auth]`), through the real
//! binary against a provider that issues OAuth2 client-credentials tokens and requires them: the
//! token is fetched once and shared, renewed before it expires, renewed once when the provider
//! refuses it (and the call sent again, charged once), a grant that fails is a 502 that leaves no
//! outcome behind, the secret is read from a file again on reload and never logged.

use std::path::Path;
use std::time::Duration;

use crate::support::process::{stderr_path, Launch};
use crate::support::provider::Provider;
use crate::support::{send, GatewayProcess};

const CLIENT_ID: &str = "client-7";
const SECRET: &str = "s3cret-from-a-mounted-file";
const ADMIN_TOKEN: &str = "upstream-auth-admin-token-0123";

/// An unfenced idempotent route `/payouts/{id}` to `provider` with `[routes.upstream_auth]`
/// reading the secret from `secret_file`.
fn route(provider: &Provider, secret_file: &Path) -> String {
    format!(
        "[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{url}\"\ntimeout = \"3s\"\n\n\
         [routes.upstream_auth]\nkind = \"oauth2_client_credentials\"\ntoken_url = \"{url}/oauth2/token\"\n\
         client_id = \"{CLIENT_ID}\"\nclient_secret_file = \"{}\"\n\n\
         [routes.fence]\nmode = \"off\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\n",
        secret_file.display(),
        url = provider.url(),
    )
}

fn start(dir: &Path, provider: &Provider, secret: &str) -> GatewayProcess {
    let secret_file = dir.join("client-secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    Launch::new()
        .admin(ADMIN_TOKEN, "")
        .logging("info", &[])
        .start(dir, &route(provider, &secret_file))
}

async fn pay(gateway: &GatewayProcess, id: &str) -> crate::support::Reply {
    // The client's own credential is never what the provider sees.
    send(
        "POST",
        &gateway.url(&format!("/payouts/{id}")),
        &[("authorization", "Bearer client-placeholder")],
        "amount=1",
    )
    .await
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(stderr_path(dir)).unwrap_or_default()
}

#[tokio::test]
async fn one_token_is_shared_and_renewed_before_it_expires() {
    let provider = Provider::start(true).await;
    // Renewed when half of its 4 s is left (the default margin, 300 s, is longer than that).
    provider.require_tokens(CLIENT_ID, SECRET, Duration::from_secs(4));
    let dir = tempfile::tempdir().unwrap();
    let gateway = start(dir.path(), &provider, SECRET);
    for id in ["1", "2", "3"] {
        let reply = pay(&gateway, id).await;
        assert_eq!(reply.status.as_u16(), 201, "{id}: {:?}", reply.body);
    }
    assert_eq!(provider.grants(), 1, "one token for every call");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Due for renewal but not expired: sent as it is while a renewal runs beside it.
    let reply = pay(&gateway, "4").await;
    assert_eq!(reply.status.as_u16(), 201, "{:?}", reply.body);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while provider.grants() < 2 {
        assert!(std::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reply = pay(&gateway, "5").await;
    assert_eq!(reply.status.as_u16(), 201, "{:?}", reply.body);
    assert_eq!(provider.grants(), 2, "renewed once, before it expired");
    assert_eq!(
        provider.presented(),
        [
            "Bearer tok-1",
            "Bearer tok-1",
            "Bearer tok-1",
            "Bearer tok-1",
            "Bearer tok-2"
        ],
        "no call was refused"
    );
    assert!(!log(dir.path()).contains(SECRET), "the secret was logged");
}

#[tokio::test]
async fn a_refused_token_is_renewed_once_and_the_call_charged_once() {
    let provider = Provider::start(true).await;
    provider.require_tokens(CLIENT_ID, SECRET, Duration::from_secs(3600));
    let dir = tempfile::tempdir().unwrap();
    let gateway = start(dir.path(), &provider, SECRET);
    assert_eq!(pay(&gateway, "1").await.status.as_u16(), 201);
    provider.revoke_tokens();
    let reply = pay(&gateway, "2").await;
    assert_eq!(reply.status.as_u16(), 201, "{:?}", reply.body);
    assert_eq!(provider.grants(), 2);
    assert_eq!(
        provider.presented(),
        ["Bearer tok-1", "Bearer tok-1", "Bearer tok-2"],
        "refused once, then sent again with the renewed token"
    );
    assert_eq!(provider.charges().len(), 2, "each payout charged once");
    // The repeat is the gateway's replay: nothing more reaches the provider.
    let again = pay(&gateway, "2").await;
    assert_eq!(again.status.as_u16(), 201);
    assert_eq!(provider.presented().len(), 3);
}

#[tokio::test]
async fn a_failed_grant_is_a_502_that_records_nothing_and_a_reload_reads_the_file_again() {
    let provider = Provider::start(true).await;
    provider.require_tokens(CLIENT_ID, SECRET, Duration::from_secs(3600));
    let dir = tempfile::tempdir().unwrap();
    let wrong = "an-old-secret-value";
    let gateway = start(dir.path(), &provider, wrong);
    let refused = pay(&gateway, "1").await;
    assert_eq!(refused.status.as_u16(), 502, "{:?}", refused.body);
    assert_eq!(refused.problem_slug(), "upstream-credentials");
    let detail = refused.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("invalid_client"), "{detail}");
    assert!(provider.charges().is_empty() && provider.presented().is_empty());

    // The operator puts the right secret in the file and reloads: the next grant uses it, and
    // the payout that failed is charged now (no outcome was recorded for it).
    std::fs::write(dir.path().join("client-secret"), format!("{SECRET}\n")).unwrap();
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let reloaded = send(
        "POST",
        &gateway.admin_url("/admin/reload"),
        &[("authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(reloaded.status.as_u16(), 200, "{:?}", reloaded.body);
    let paid = pay(&gateway, "1").await;
    assert_eq!(paid.status.as_u16(), 201, "{:?}", paid.body);
    assert_eq!(provider.charges().len(), 1);

    // A provider that refuses every token, even a fresh one: 502 again, nothing recorded.
    provider.revoke_tokens();
    provider.require_tokens(
        CLIENT_ID,
        "rotated-at-the-provider",
        Duration::from_secs(3600),
    );
    let refused = pay(&gateway, "2").await;
    assert_eq!(refused.status.as_u16(), 502, "{:?}", refused.body);
    assert_eq!(refused.problem_slug(), "upstream-credentials");
    assert_eq!(provider.charges().len(), 1);

    let log = log(dir.path());
    for secret in [SECRET, wrong] {
        assert!(!log.contains(secret), "{secret} was logged: {log}");
    }
    assert!(log.contains("obtaining an upstream token failed"), "{log}");
}
