//! The command line: `check-config` exit codes and messages, `--version`, and the shipped example
//! configurations.

use std::process::Command;

use crate::support;
use crate::support::process::binary;

fn fencegate(args: &[&str]) -> std::process::Output {
    Command::new(binary())
        .args(args)
        .output()
        .expect("run fencegate")
}

#[test]
fn shipped_example_configs_are_valid() {
    for file in [
        "config/fencegate.toml",
        "config/docker.toml",
        "config/postgres.toml",
        "config/redis.toml",
        "config/stripe.toml",
        "deploy/fencegate-replica-1.toml",
        "deploy/fencegate-replica-2.toml",
    ] {
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        // config/stripe.toml reads the provider's secret key from the environment.
        let output = Command::new(binary())
            .args(["check-config", &path])
            .env("STRIPE_SECRET_KEY", "sk_test_check_config")
            .output()
            .expect("run fencegate");
        assert!(
            output.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn check_config_names_the_file_the_route_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:8080\"\n\n[[routes]]\nname = \"ok\"\npath = \"/a/{id}\"\nupstream = \"http://127.0.0.1:9000\"\nresource_key = \"a:{id}\"\n\n[[routes]]\nname = \"payouts\"\npath = \"/payouts/{id}\"\nupstream = \"http://127.0.0.1:9000\"\nresource_key = \"payout:{id}\"\n[routes.fence]\ncompare = \"sometimes\"\n",
    )
    .unwrap();
    let output = fencegate(&["check-config", path.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("broken.toml"), "{stderr}");
    assert!(stderr.contains("\"payouts\""), "{stderr}");
    assert!(stderr.contains("fence.compare"), "{stderr}");
}

#[test]
fn check_config_reports_semantic_errors_with_route_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad-upstream.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:8080\"\n[[routes]]\nname = \"files\"\npath = \"/f/{id}\"\nupstream = \"ftp://example.test\"\nresource_key = \"f:{id}\"\n",
    )
    .unwrap();
    let output = fencegate(&["check-config", path.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad-upstream.toml")
            && stderr.contains("\"files\"")
            && stderr.contains("upstream"),
        "{stderr}"
    );
}

#[test]
fn check_config_reads_the_store_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let cases = [
        (
            format!("[store]\nbackend = \"redis\"\nurl = \"rediss://db:6380\"\n[store.tls]\nca_file = {:?}\n", not_pem.display().to_string()),
            "store.tls.ca_file",
        ),
        (
            "[store]\nbackend = \"postgres\"\nurl = \"postgres://u@db/test?sslmode=verify-full&sslrootcert=/nonexistent/root.crt\"\n".to_owned(),
            "store.url",
        ),
        (
            "[store]\nbackend = \"redis\"\nurl = \"redis://db:6379\"\n[store.tls]\n".to_owned(),
            "store.tls",
        ),
    ];
    for (store, field) in cases {
        let path = dir.path().join("store-tls.toml");
        std::fs::write(
            &path,
            format!("[server]\nlisten = \"127.0.0.1:8080\"\n{store}"),
        )
        .unwrap();
        let output = fencegate(&["check-config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{store}");
        assert!(stderr.contains(field), "{field}: {stderr}");
    }
}

#[test]
fn missing_config_file_is_a_clear_error() {
    let output = fencegate(&["serve", "--config", "/nonexistent/fencegate.toml"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/nonexistent/fencegate.toml") && stderr.contains("cannot read"),
        "{stderr}"
    );
}

#[test]
fn version_flag_prints_the_package_version() {
    let output = fencegate(&["--version"]);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.trim(),
        format!("fencegate {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn migrate_creates_the_postgres_schema_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let schema = support::postgres::unique_schema();
    let path = dir.path().join("pg.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\n[store]\nbackend = \"postgres\"\nurl = \"{}\"\nschema = \"{schema}\"\n",
            support::postgres::TEST_POSTGRES_URL
        ),
    )
    .unwrap();
    for _ in 0..2 {
        let output = fencegate(&["migrate", "--config", path.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            stdout.contains(&format!("schema {schema} is up to date")),
            "{stdout}"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(support::postgres::drop_schema(&schema));
}
