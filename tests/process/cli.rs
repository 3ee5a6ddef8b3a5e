//! The command line: `check-config` exit codes and messages, `serve` that cannot start,
//! `migrate`, `--version`, and the shipped example configurations.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use crate::support::gateway::{config_text_with_store, embedded_store};
use crate::support::process::{binary, free_port};
use crate::support::GatewayProcess;

/// What the shipped files other than config/fencegate.toml read from `FENCEGATE_ADMIN_TOKEN`.
const ADMIN_TOKEN: &str = "cli-test-admin-token-0123456789";

/// How long a `serve` that cannot start may take to exit.
const START_FAILURE_TIMEOUT: Duration = Duration::from_secs(30);

fn fencegate(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .output()
        .expect("run fencegate")
}

/// `fencegate serve --config config`, expected to exit on its own: its status and stderr (with
/// `RUST_LOG` unset, as an operator starts it).
fn serve_until_exit(config: &Path) -> (std::process::ExitStatus, String) {
    let stderr_file = config.with_extension("stderr");
    let stderr = std::fs::File::create(&stderr_file).expect("create the stderr file");
    let mut child = Command::new(binary())
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start fencegate");
    let deadline = Instant::now() + START_FAILURE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll fencegate") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "fencegate serve --config {} did not exit within {START_FAILURE_TIMEOUT:?}",
                config.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status,
        std::fs::read_to_string(&stderr_file).unwrap_or_default(),
    )
}

/// The configurations under `config/`, the examples users copy.
const EXAMPLE_CONFIGS: [&str; 9] = [
    "config/fencegate.toml",
    "config/docker.toml",
    "config/postgres.toml",
    "config/redis.toml",
    "config/etcd.toml",
    "config/stripe.toml",
    "config/adyen.toml",
    "config/paypal.toml",
    "config/square.toml",
];

#[test]
fn shipped_example_configs_are_valid() {
    let deploy = [
        "deploy/fencegate-replica-1.toml",
        "deploy/fencegate-replica-2.toml",
    ];
    for file in EXAMPLE_CONFIGS.into_iter().chain(deploy) {
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        // The provider files read the provider's credentials from the environment, and every
        // file but config/fencegate.toml the admin token.
        let output = Command::new(binary())
            .args(["check-config", &path])
            .env("STRIPE_SECRET_KEY", "sk_test_check_config")
            .env("ADYEN_API_KEY", "AQE_check_config")
            .env("SQUARE_ACCESS_TOKEN", "EAAA_check_config")
            .env("PAYPAL_CLIENT_ID", "client_check_config")
            .env("PAYPAL_CLIENT_SECRET", "secret_check_config")
            .env("FENCEGATE_ADMIN_TOKEN", ADMIN_TOKEN)
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
fn check_config_lists_the_untyped_key_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("typed.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:8080\"\n\n[[routes]]\nname = \"typed\"\npath = \"/orders/{id:int}\"\nupstream = \"http://127.0.0.1:9000\"\nresource_key = \"order:{id}:{query:v:uuid}\"\n\n[[routes]]\nname = \"loose\"\npath = \"/parcels/{id}\"\nupstream = \"http://127.0.0.1:9000\"\nresource_key = \"parcel:{id}:{header:X-Tenant}:{query:s:str}\"\n",
    )
    .unwrap();
    let output = fencegate(&["check-config", path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("route \"loose\": untyped key inputs {id}, {header:x-tenant}:"),
        "{stdout}"
    );
    assert!(!stdout.contains("route \"typed\""), "{stdout}");
    assert!(!stdout.contains("{query:s}"), "{stdout}");
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
        ("kind = \"consul\"\nlock_key = \"job:{id}\"".to_owned(), "kind"),
        ("kind = \"zookeeper\"\nlock_key = \"/jobs/{id}\"".to_owned(), "fence.authority.hosts"),
        ("kind = \"zookeeper\"\nhosts = \"zk1\"\nlock_key = \"/jobs/{id}\"".to_owned(), "fence.authority.hosts"),
        ("kind = \"zookeeper\"\nhosts = \"zk1:2181\"\nlock_key = \"jobs/{id}\"".to_owned(), "fence.authority.lock_key"),
        ("kind = \"zookeeper\"\nhosts = \"zk1:2181\"\nlock_key = \"/jobs/{id}\"\nendpoints = [\"http://e:2379\"]".to_owned(), "fence.authority.endpoints"),
        ("kind = \"zookeeper\"\nhosts = \"zk1:2181:2\"\nlock_key = \"/jobs/{id}\"".to_owned(), "fence.authority.hosts"),
        ("kind = \"zookeeper\"\nhosts = \"zk1:2181\"\nlock_key = \"/jobs/../{id}\"".to_owned(), "fence.authority.lock_key"),
        (format!("{etcd}\nlock_key = \"locks/{{id}}\"\nsession_timeout = \"5s\""), "fence.authority.session_timeout"),
        ("kind = \"zookeeper\"\nhosts = \"zk1:2181\"\nlock_key = \"/jobs/{id}\"\ntoken = \"mzxid\"".to_owned(), "token"),
        ("kind = \"zookeeper\"\nhosts = \"zk1:2181\"\nlock_key = \"/jobs/{id}\"\nusername = \"u\"".to_owned(), "fence.authority.password_env"),
        (format!("{etcd}\nlock_key = \"locks/{{id}}\"\nhosts = \"zk1:2181\""), "fence.authority.hosts"),
        ("kind = \"postgres\"\nurl = \"postgres://db/app\"\nlock_key = \"job:{id}\"\ntoken = \"czxid\"".to_owned(), "fence.authority.token"),
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
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        // The admin token comes from a variable this process does not set (and must not: no
        // set_var), and is beside the point here: written inline instead.
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .replace(
                "token_env = \"FENCEGATE_ADMIN_TOKEN\"",
                &format!("token = \"{ADMIN_TOKEN}\""),
            );
        let config = fencegate::config::parse_str(&text, &path).unwrap_or_else(|e| panic!("{e}"));
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
    let mut said = Vec::new();
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
        said.push(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    assert_eq!(said[0], said[1], "the two forms check the same file");
    assert!(said[0].contains("config/fencegate.toml: ok"), "{}", said[0]);
    assert!(!fencegate(&["check-config"]).status.success());
    assert!(
        !fencegate(&["check-config", path.as_str(), "--config", path.as_str()])
            .status
            .success(),
        "the file named twice"
    );
}

/// `[admin] token_env` names a variable `serve` reads at start: check-config refuses the file
/// when that variable is unset, empty or shorter than 16 characters, naming the file, the field
/// and the variable, and accepts it once the variable holds a token.
#[test]
fn check_config_refuses_an_admin_token_env_that_is_unset_or_short() {
    const VARIABLE: &str = "FENCEGATE_TEST_CLI_ADMIN_TOKEN";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-token.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\n\n[admin]\nlisten = \"127.0.0.1:9090\"\ntoken_env = \"{VARIABLE}\"\n"
        ),
    )
    .unwrap();
    let check = |value: Option<&str>| {
        let mut command = Command::new(binary());
        command
            .args(["check-config", path.to_str().unwrap()])
            .env_remove(VARIABLE);
        if let Some(value) = value {
            command.env(VARIABLE, value);
        }
        command.output().expect("run fencegate")
    };
    for (value, says) in [
        (None, "is not set"),
        (Some(""), "is empty"),
        (Some("fifteen-chars!!"), "fewer than 16 characters"),
    ] {
        let output = check(value);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{value:?}: accepted");
        for part in ["admin-token.toml", "admin.token_env", VARIABLE, says] {
            assert!(stderr.contains(part), "{value:?}: no {part:?} in {stderr}");
        }
    }
    let output = check(Some("sixteen-chars-ok"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("admin-token.toml: ok"), "{stdout}");
}

/// `[admin] token_file` (a mounted secret) instead of `token_env`: check-config reads the file
/// and refuses it when it is absent, empty or short, naming the field and the file.
#[test]
fn check_config_reads_an_admin_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin-token");
    let path = dir.path().join("admin-token-file.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\n\n[admin]\nlisten = \"127.0.0.1:9090\"\ntoken_file = \"{}\"\n",
            token.display()
        ),
    )
    .unwrap();
    let check = || {
        Command::new(binary())
            .args(["check-config", path.to_str().unwrap()])
            .output()
            .expect("run fencegate")
    };
    for (content, says) in [
        (None, "No such file"),
        (Some("\n"), "is empty"),
        (Some("fifteen-chars!!\n"), "fewer than 16 characters"),
    ] {
        match content {
            Some(text) => std::fs::write(&token, text).unwrap(),
            None => {
                let _ = std::fs::remove_file(&token);
            }
        }
        let output = check();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{content:?}: accepted");
        for part in ["admin.token_file", "admin-token", says] {
            assert!(
                stderr.contains(part),
                "{content:?}: no {part:?} in {stderr}"
            );
        }
    }
    std::fs::write(&token, "sixteen-chars-ok\n").unwrap();
    let output = check();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A `serve` that cannot start says which configuration file it was starting from, beside the
/// reason: a store path that cannot be created, a listen address already in use.
#[test]
fn serve_start_failures_name_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_directory = dir.path().join("not-a-directory");
    std::fs::write(
        &not_a_directory,
        "a file where the store's directory would be",
    )
    .unwrap();
    let unwritable_store = format!(
        "[store]\nbackend = \"embedded\"\npath = \"{}\"\n",
        not_a_directory.join("fencegate.db").display()
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a listener");
    let taken_addr = taken.local_addr().unwrap().to_string();
    let cases = [
        (
            "unwritable-store.toml",
            free_port().to_string(),
            unwritable_store,
        ),
        (
            "address-in-use.toml",
            taken_addr,
            embedded_store(dir.path()),
        ),
    ];
    for (name, listen, store) in cases {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            config_text_with_store(dir.path(), &listen, &store, ""),
        )
        .unwrap();
        let (status, stderr) = serve_until_exit(&path);
        assert!(!status.success(), "{name}: {status}");
        assert!(
            stderr.contains(&path.display().to_string()) && stderr.contains("cannot serve"),
            "{name}: {stderr}"
        );
    }
    drop(taken);
}

/// `[store]` without `backend` is the embedded store (the default): check-config accepts it, and
/// `serve` keeps its marks in the file at `path`.
#[test]
fn a_store_table_with_only_a_path_is_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("marks").join("plain.db");
    std::fs::create_dir(dir.path().join("marks")).unwrap();
    let store = format!("[store]\npath = \"{}\"\n", file.display());
    let path = dir.path().join("path-only.toml");
    std::fs::write(
        &path,
        config_text_with_store(dir.path(), "127.0.0.1:8080", &store, ""),
    )
    .unwrap();
    let output = fencegate(&["check-config", path.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!file.exists());
    let _gateway = GatewayProcess::start_with_store(dir.path(), &store, "");
    assert!(
        file.exists(),
        "serve did not open the embedded store at {}",
        file.display()
    );
}

/// `listen` takes an IP address: `localhost:8401` in `[server]` or `[admin]` is refused with a
/// hint that shows what to write instead.
#[test]
fn a_listen_host_name_is_refused_with_an_ip_address_hint() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[server]\nlisten = \"localhost:8401\"\n".to_owned(), "server.listen"),
        (
            format!("[server]\nlisten = \"127.0.0.1:8080\"\n\n[admin]\nlisten = \"localhost:8401\"\ntoken = \"{ADMIN_TOKEN}\"\n"),
            "admin.listen",
        ),
    ];
    for (text, field) in cases {
        let path = dir.path().join("host-name.toml");
        std::fs::write(&path, text).unwrap();
        let output = fencegate(&["check-config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{field}: accepted");
        for part in ["host-name.toml", field, "127.0.0.1:8401"] {
            assert!(stderr.contains(part), "{field}: no {part:?} in {stderr}");
        }
    }
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
    // The first run applies every migration and names each (`1 fence marks` for
    // 0001_fence_marks.sql, as sqlx records it); the second has none to apply.
    let names = migration_names();
    let expected = [
        format!("schema {schema}: applied {} migration(s)", names.len()),
        format!("schema {schema} was already up to date: no migration to apply"),
    ];
    for (run, expected) in expected.iter().enumerate() {
        let output = fencegate(&["migrate", "--config", path.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains(expected), "{stdout}");
        for name in &names {
            let line = format!("  {name}\n");
            assert_eq!(
                stdout.contains(&line),
                run == 0,
                "run {run}: {name}: {stdout}"
            );
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(support::postgres::drop_schema(&schema));
}

/// The files under migrations/postgres as `migrate` names them: `version description`.
fn migration_names() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|file| {
            let stem = file.strip_suffix(".sql")?;
            let (version, description) = stem.split_once('_')?;
            let version: i64 = version.parse().ok()?;
            Some(format!("{version} {}", description.replace('_', " ")))
        })
        .collect();
    names.sort_by_key(|name| name.split(' ').next().and_then(|v| v.parse::<i64>().ok()));
    assert!(!names.is_empty(), "no migrations under {dir}");
    names
}

#[test]
fn check_config_refuses_framing_headers_among_stored_headers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stored.toml");
    for (stored, refused) in [
        ("[\"content-type\", \"content-length\"]", true),
        ("[\"Transfer-Encoding\"]", true),
        ("[\"content-type\", \"location\"]", false),
    ] {
        std::fs::write(
            &path,
            format!(
                "[server]\nlisten = \"127.0.0.1:8080\"\n\n[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"http://127.0.0.1:9\"\nresource_key = \"payout:{{id}}\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\nstored_headers = {stored}\n"
            ),
        )
        .unwrap();
        let output = fencegate(&["check-config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(!output.status.success(), refused, "{stored}: {stderr}");
        if refused {
            assert!(
                stderr.contains("idempotency.stored_headers") && stderr.contains("frames"),
                "{stored}: {stderr}"
            );
        }
    }
}

#[test]
fn one_shot_commands_need_no_admin_token_and_a_store_url_asks_for_its_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\nstate_dir = \"{dir}\"\n[store]\npath = \"{dir}/f.db\"\n[admin]\nlisten = \"127.0.0.1:9\"\ntoken_env = \"FENCEGATE_TEST_UNSET_ADMIN_TOKEN\"\n",
            dir = dir.path().display()
        ),
    )
    .unwrap();
    // `intents list` reads the store; the admin token is for serving.
    let listed = fencegate(&["intents", "list", "--config", path.to_str().unwrap()]);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let checked = fencegate(&["check-config", path.to_str().unwrap()]);
    assert!(!checked.status.success(), "check-config still checks it");

    let url = dir.path().join("url.toml");
    std::fs::write(
        &url,
        "[server]\nlisten = \"127.0.0.1:8080\"\n[store]\nurl = \"postgres://db/app\"\n",
    )
    .unwrap();
    let output = fencegate(&["check-config", url.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("store.backend") && stderr.contains("`url`") && stderr.contains("postgres"),
        "{stderr}"
    );
}
