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

/// The configurations under `config/`, the examples users copy.
const EXAMPLE_CONFIGS: [&str; 6] = [
    "config/fencegate.toml",
    "config/docker.toml",
    "config/postgres.toml",
    "config/redis.toml",
    "config/etcd.toml",
    "config/stripe.toml",
];

#[test]
fn shipped_example_configs_are_valid() {
    let deploy = [
        "deploy/fencegate-replica-1.toml",
        "deploy/fencegate-replica-2.toml",
    ];
    for file in EXAMPLE_CONFIGS.into_iter().chain(deploy) {
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
fn check_config_names_the_etcd_store_field_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("endpoints = []", "store.endpoints"),
        ("endpoints = [\"127.0.0.1:2379\"]", "store.endpoints"),
        ("endpoints = [\"http://127.0.0.1:2379\"]\nmax_batch = 200", "store.max_batch"),
        ("endpoints = [\"http://127.0.0.1:2379\"]\nusername = \"fencegate\"", "store.password_env"),
        ("endpoints = [\"http://127.0.0.1:2379\"]\nkey_prefix = \"\"", "store.key_prefix"),
        ("endpoints = [\"http://127.0.0.1:2379\"]\n[store.tls]\nca_file = \"ca.pem\"", "store.tls"),
        ("endpoints = [\"https://127.0.0.1:2379\"]\n[store.tls]\nca_file = \"/nonexistent/ca.pem\"", "store.tls.ca_file"),
    ];
    for (store, field) in cases {
        let path = dir.path().join("etcd.toml");
        std::fs::write(
            &path,
            format!(
                "[server]\nlisten = \"127.0.0.1:8080\"\n\n[store]\nbackend = \"etcd\"\n{store}\n"
            ),
        )
        .unwrap();
        let output = fencegate(&["check-config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{store}: accepted");
        assert!(
            stderr.contains("etcd.toml") && stderr.contains(field),
            "{store}: expected {field}: {stderr}"
        );
    }
}

#[test]
fn check_config_names_the_authority_field_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = "kind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]";
    let cases = [
        (format!("{etcd}\nlock_key = \"locks/{{other}}\""), "fence.authority.resource_key"),
        (format!("{etcd}\nlock_key = \"locks/{{a}}{{id}}\"\nresource_key = \"r:{{a}}:{{id}}\""), "fence.authority.lock_key"),
        (format!("{etcd}\nlock_key = \"locks/{{id}}\"\nstrict = true"), "fence.authority.strict"),
        ("kind = \"etcd\"\nlock_key = \"locks/{id}\"".to_owned(), "fence.authority.endpoints"),
        (format!("{etcd}\nlock_key = \"locks/{{id}}\"\nusername = \"u\""), "fence.authority.password_env"),
        (format!("{etcd}\nlock_key = \"locks/{{id}}\"\npassword_env = \"FENCEGATE_TEST_UNSET_PASSWORD\"\nusername = \"u\""), "fence.authority.password_env"),
        ("kind = \"postgres\"\nlock_key = \"job:{id}\"".to_owned(), "fence.authority.url"),
        ("kind = \"postgres\"\nurl = \"postgres://db/app\"\nlock_key = \"job:{id}\"\ntable = \"locks; drop\"".to_owned(), "fence.authority.table"),
        ("kind = \"zookeeper\"\nlock_key = \"job:{id}\"".to_owned(), "kind"),
    ];
    for (authority, field) in cases {
        let path = dir.path().join("authority.toml");
        std::fs::write(
            &path,
            format!(
                "[server]\nlisten = \"127.0.0.1:8080\"\n\n[[routes]]\nname = \"jobs\"\npath = \"/jobs/{{id}}\"\nupstream = \"http://127.0.0.1:9\"\nresource_key = \"job:{{id}}\"\n\n[routes.fence.authority]\n{authority}\n"
            ),
        )
        .unwrap();
        let output = fencegate(&["check-config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{authority}: accepted");
        assert!(
            stderr.contains("authority.toml") && stderr.contains(field),
            "{authority}: expected {field}: {stderr}"
        );
    }
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

/// Two shipped configs with one `state_dir` must name one store: the directory records the store
/// it adopted, and trying `config/postgres.toml` and then `config/redis.toml` used to lock fenced
/// traffic out with a message about a wiped store.
#[test]
fn shipped_configs_that_share_a_state_dir_share_the_store() {
    use fencegate::config::StoreConfig;
    let mut seen: Vec<(std::path::PathBuf, String, &str)> = Vec::new();
    for file in EXAMPLE_CONFIGS {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let config = fencegate::config::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let store = match &config.store {
            StoreConfig::Embedded(c) => format!("embedded {}", c.path.display()),
            StoreConfig::Postgres(c) => format!("postgres {} {}", c.url, c.schema),
            StoreConfig::Redis(c) => format!("redis {} {}", c.url, c.key_prefix),
            StoreConfig::Etcd(c) => format!("etcd {:?} {}", c.endpoints, c.key_prefix),
        };
        for (dir, other_store, other_file) in &seen {
            assert!(
                *dir != config.server.state_dir || *other_store == store,
                "{file} and {other_file} share state_dir {} but not the store: {store} / {other_store}",
                dir.display()
            );
        }
        seen.push((config.server.state_dir.clone(), store, file));
    }
}

#[test]
fn check_config_takes_the_file_as_every_subcommand_does() {
    let path = format!("{}/config/fencegate.toml", env!("CARGO_MANIFEST_DIR"));
    for args in [
        vec!["check-config", path.as_str()],
        vec!["check-config", "--config", path.as_str()],
    ] {
        let output = fencegate(&args);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    assert!(!fencegate(&["check-config"]).status.success());
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
    // The first run applies every migration and says so; the second has none to apply.
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .unwrap()
        .count();
    let expected = [
        format!("schema {schema}: applied {migrations} migration(s)"),
        format!("schema {schema} was already up to date: no migration to apply"),
    ];
    for expected in expected {
        let output = fencegate(&["migrate", "--config", path.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains(&expected), "{stdout}");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(support::postgres::drop_schema(&schema));
}
