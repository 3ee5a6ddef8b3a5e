//! Reaching a secured etcd, against the local servers `scripts/etcd-setup.sh` starts: TLS with a
//! client certificate required (2381, the test CA of `scripts/tls-setup.sh`), and etcd's own
//! authentication (2383: user `fencegate`, allowed only under `fencegate-test/`). A wrong CA, a
//! missing client certificate, a wrong password or a prefix the user may not write fails; the
//! right settings fence. These tests fail, never skip, when the servers are not there.

use fencegate::config::{Compare, StoreConfig};
use fencegate::store::{Advance, Backend};

use crate::support;
use crate::support::store_tls::toml_path;

/// TLS only, client certificates from the test CA required; its certificate names localhost.
const TLS_ENDPOINT: &str = "https://localhost:2381";
/// Authentication on: user `fencegate` may read and write only under `fencegate-test/`.
const AUTH_ENDPOINT: &str = "http://127.0.0.1:2383";
/// The password of the test user (the environment variable named below holds it).
const AUTH_PASSWORD: &str = "fencegate-test";

async fn open(toml_text: &str) -> Result<Backend, String> {
    let config: StoreConfig =
        toml::from_str(toml_text).unwrap_or_else(|e| panic!("{e}\n{toml_text}"));
    fencegate::store::open(&config, "etcd-access-test")
        .await
        .map_err(|e| e.to_string())
}

async fn fences(backend: &Backend) {
    let key = format!("k:{}", uuid::Uuid::new_v4());
    let outcome = backend.fences.advance(&key, 7, Compare::Monotonic).await;
    assert_eq!(outcome.ok(), Some(Advance::Accepted { previous: None }));
    let stale = backend.fences.advance(&key, 6, Compare::Monotonic).await;
    assert_eq!(stale.ok(), Some(Advance::Stale { current: 7 }));
    let identity = backend.fences.identity().await.expect("identity");
    assert!(identity.id.contains('@'), "{}", identity.id);
    backend.fences.close().await.expect("close");
}

fn tls_store(prefix: &str, tls: &str) -> String {
    format!(
        "backend = \"etcd\"\nendpoints = [\"{TLS_ENDPOINT}\"]\nkey_prefix = \"{prefix}\"\n{tls}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_a_client_certificate() {
    let prefix = support::etcd::unique_prefix();
    let tls = format!(
        "[tls]\nca_file = {}\nclient_cert = {}\nclient_key = {}\n",
        toml_path("ca.pem"),
        toml_path("client.pem"),
        toml_path("client.key")
    );
    let backend = open(&tls_store(&prefix, &tls)).await.unwrap_or_else(|e| {
        panic!("etcd over TLS on {TLS_ENDPOINT} (scripts/etcd-setup.sh starts it): {e}")
    });
    fences(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_refuses_a_wrong_ca_and_a_missing_client_certificate() {
    let prefix = support::etcd::unique_prefix();
    let other_ca = format!(
        "[tls]\nca_file = {}\nclient_cert = {}\nclient_key = {}\n",
        toml_path("other-ca.pem"),
        toml_path("client.pem"),
        toml_path("client.key")
    );
    match open(&tls_store(&prefix, &other_ca)).await {
        Ok(_) => panic!("an etcd certificate from an unknown CA was accepted"),
        Err(error) => assert!(error.contains("2381"), "{error}"),
    }
    let no_client = format!("[tls]\nca_file = {}\n", toml_path("ca.pem"));
    if open(&tls_store(&prefix, &no_client)).await.is_ok() {
        panic!("the server on 2381 must require a client certificate");
    }
    // Without the table the web roots are trusted, and the test CA is not one of them.
    match open(&tls_store(&prefix, "")).await {
        Ok(_) => panic!("the web roots accepted the test CA's certificate"),
        Err(error) => assert!(error.contains("cannot reach etcd"), "{error}"),
    }
}

fn auth_store(prefix: &str, variable: &str) -> String {
    format!(
        "backend = \"etcd\"\nendpoints = [\"{AUTH_ENDPOINT}\"]\nkey_prefix = \"{prefix}\"\nusername = \"fencegate\"\npassword_env = \"{variable}\"\n"
    )
}

/// A variable only this test reads (the process's environment is shared by the tests running at
/// once, so each test names its own).
fn password_variable(value: &str) -> String {
    let name = format!(
        "FENCEGATE_TEST_ETCD_PASSWORD_{}",
        uuid::Uuid::new_v4().simple()
    );
    // No other test reads or writes this variable: its name is new.
    std::env::set_var(&name, value);
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_authentication_fences_under_the_users_prefix() {
    let prefix = support::etcd::unique_prefix();
    let variable = password_variable(AUTH_PASSWORD);
    let backend = open(&auth_store(&prefix, &variable))
        .await
        .unwrap_or_else(|e| {
            panic!("etcd with authentication on {AUTH_ENDPOINT} (scripts/etcd-setup.sh): {e}")
        });
    fences(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_authentication_refuses_what_the_user_may_not_do() {
    // A wrong password: the store does not open, and the error says why.
    let prefix = support::etcd::unique_prefix();
    let wrong = password_variable("not-the-password");
    match open(&auth_store(&prefix, &wrong)).await {
        Ok(_) => panic!("a wrong password was accepted"),
        Err(error) => assert!(error.contains("authentication failed"), "{error}"),
    }
    // A prefix outside the user's permission: refused by etcd, never a silent success.
    let right = password_variable(AUTH_PASSWORD);
    let outside = format!("elsewhere/{}/", uuid::Uuid::new_v4());
    match open(&auth_store(&outside, &right)).await {
        Ok(_) => panic!("a prefix the user may not read was opened"),
        Err(error) => assert!(error.contains("permission denied"), "{error}"),
    }
    // An unset variable names the field.
    match open(&auth_store(
        &prefix,
        "FENCEGATE_TEST_ETCD_PASSWORD_NEVER_SET",
    ))
    .await
    {
        Ok(_) => panic!("an unset password variable was accepted"),
        Err(error) => assert!(error.contains("store.password_env"), "{error}"),
    }
}
