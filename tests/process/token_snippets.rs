//! The client snippets of docs/getting-tokens.md run as shipped: each takes its lock, prints the
//! fencing token the lock service gave it and writes once through the real binary, and the
//! upstream receives that write carrying that token; a second holder gets a higher token, after
//! which the first one's token is refused; and through a route that follows the lock itself (the
//! authority watch), the released holder's token and a made-up one are refused. The etcd and
//! PostgreSQL snippets need the machine's etcd (127.0.0.1:2379) and PostgreSQL (127.0.0.1:5432)
//! and fail when either is missing; the PostgreSQL one needs psycopg (`tests/upstreams/install.sh`).
//! The ZooKeeper snippets (the hand-made lock recipe, zk_lock.py; kazoo's own `Lock`,
//! kazoo_lock.py; Curator's `InterProcessMutex`, CuratorLock.java, compiled here once with javac)
//! need ZooKeeper at 127.0.0.1:2181 (scripts/zookeeper-setup.sh), and kazoo, or a JDK and Debian's
//! Curator jars in /usr/share/java (`tests/upstreams/install.sh` installs all three), and fail
//! without them; so does the Rust ZooKeeper worker (examples/zk_worker.rs, run by
//! `cargo run --example`), without ZooKeeper. Each ZooKeeper test takes a root of its own
//! (`/fencegate-test-<uuid>`) and deletes its tree at the end, passed or failed. The Redis snippet
//! (redis_lock.py) needs Redis at 127.0.0.1:6379 and redis-py; the DynamoDB one (dynamodb_lock.py)
//! runs against moto's emulation of DynamoDB, started here, and needs boto3 and moto
//! (`tests/upstreams/install.sh`).

use std::future::Future;
use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sqlx::Connection as _;

use crate::support::gateway::fenced_route;
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::zookeeper::{unique_root, zk_delete_tree, zk_observer, ZK_HOSTS};
use crate::support::{etcd, send, Behavior, GatewayProcess, RecordingUpstream};

/// Where Debian installs Java libraries.
const JAVA_LIBRARY: &str = "/usr/share/java";
/// The jars of the Java snippets' class path, in [`JAVA_LIBRARY`]: Curator (Debian's
/// libcurator-recipes-java) with what it needs of ZooKeeper, Guava and SLF4J, and slf4j-simple
/// so that the clients' warnings reach the snippet's stderr (`SLF4J_LEVEL`).
const JAVA_JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-simple",
];
/// What slf4j-simple logs: warnings and errors, not ZooKeeper's every connection step.
const SLF4J_LEVEL: &str = "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn";
/// What to run when kazoo is missing.
const KAZOO_INSTALL: &str = "run tests/upstreams/install.sh (scripts/test.sh does)";
/// What to run when javac or a jar is missing.
const JAVA_INSTALL: &str =
    "run tests/upstreams/install.sh (it installs a JDK and Debian's libcurator-recipes-java)";

/// What one run of a snippet printed, and how it ended.
struct SnippetRun {
    token: u64,
    status: u16,
    output: String,
}

fn snippet_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/tokens")
        .join(name)
}

/// The command that runs snippet `name`: `python3 examples/tokens/NAME` for a Python one,
/// `java CLASS` for `CLASS.java` (compiled by [`compiled_java_snippets`]), else the example
/// `NAME` through the cargo running the tests (`cargo run --example NAME`, which builds it first
/// when it is not up to date: `cargo test --test process` does not build examples).
fn snippet_command(name: &str) -> Command {
    if name.ends_with(".py") {
        let mut python = Command::new("python3");
        python.arg(snippet_path(name));
        python
    } else if let Some(class) = name.strip_suffix(".java") {
        let class_path = format!(
            "{}:{}",
            compiled_java_snippets().display(),
            java_class_path()
        );
        let mut java = Command::new("java");
        java.args(["-cp", &class_path, SLF4J_LEVEL, class]);
        java
    } else {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["run", "--quiet", "--example", name, "--"]);
        // Not the variables cargo set for this test binary (`CARGO_PKG_NAME`, `OUT_DIR`, ...):
        // build scripts watch some (ring's do), so this cargo would rebuild them, and the next
        // `cargo test`, without them, again (40 s each way here).
        for (variable, _) in std::env::vars_os() {
            if variable.to_str().is_some_and(set_by_cargo_for_this_test) {
                cargo.env_remove(variable);
            }
        }
        cargo
    }
}

/// The Java snippets' class path: [`JAVA_JARS`] in [`JAVA_LIBRARY`]. Panics, naming the fix, when
/// one is missing.
fn java_class_path() -> String {
    let jars: Vec<String> = JAVA_JARS
        .iter()
        .map(|jar| format!("{JAVA_LIBRARY}/{jar}.jar"))
        .collect();
    let missing: Vec<&String> = jars
        .iter()
        .filter(|jar| !Path::new(jar).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "the Java snippets need {missing:?}; {JAVA_INSTALL}"
    );
    jars.join(":")
}

/// The directory of the Java snippets' classes (`examples/tokens/*.java`), compiled with javac
/// once per version of their sources and class path, into `CARGO_TARGET_TMPDIR`: in a directory
/// of its own first, then renamed into place, so that test processes running at once never see
/// half-written classes. Panics, naming the fix, when javac or a jar is missing, or javac fails.
fn compiled_java_snippets() -> &'static Path {
    static CLASSES: OnceLock<PathBuf> = OnceLock::new();
    CLASSES.get_or_init(|| {
        // Checked even when the classes are there: java comes with javac.
        let javac = Command::new("javac")
            .arg("-version")
            .output()
            .unwrap_or_else(|e| panic!("javac could not be run ({e}); {JAVA_INSTALL}"));
        assert!(
            javac.status.success(),
            "javac -version failed; {JAVA_INSTALL}"
        );
        let class_path = java_class_path();
        let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/tokens");
        let mut sources: Vec<PathBuf> = std::fs::read_dir(&examples)
            .unwrap_or_else(|e| panic!("listing {}: {e}", examples.display()))
            .map(|entry| entry.expect("an entry of examples/tokens").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "java"))
            .collect();
        sources.sort();
        let mut version = std::collections::hash_map::DefaultHasher::new();
        class_path.hash(&mut version);
        for source in &sources {
            std::fs::read(source)
                .unwrap_or_else(|e| panic!("reading {}: {e}", source.display()))
                .hash(&mut version);
        }
        let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let classes = target_tmp.join(format!("token-snippets-java-{:016x}", version.finish()));
        if classes.is_dir() {
            return classes;
        }
        let staging = tempfile::tempdir_in(target_tmp).expect("a directory for javac's classes");
        let compiled = Command::new("javac")
            .arg("-d")
            .arg(staging.path())
            .args(["-cp", &class_path])
            .args(&sources)
            .output()
            .unwrap_or_else(|e| panic!("javac could not be run ({e}); {JAVA_INSTALL}"));
        assert!(
            compiled.status.success(),
            "javac {sources:?} failed ({}):\n{}{}",
            compiled.status,
            String::from_utf8_lossy(&compiled.stdout),
            String::from_utf8_lossy(&compiled.stderr)
        );
        // Another process may have put the same classes there first: theirs serve as well.
        if let Err(e) = std::fs::rename(staging.path(), &classes) {
            assert!(
                classes.is_dir(),
                "moving the classes to {}: {e}",
                classes.display()
            );
        }
        classes
    })
}

/// Whether cargo sets `variable` for the test binaries it runs (they describe this package).
fn set_by_cargo_for_this_test(variable: &str) -> bool {
    ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_EXE_"]
        .iter()
        .any(|prefix| variable.starts_with(prefix))
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_MAKEFLAGS",
            "OUT_DIR",
        ]
        .contains(&variable)
}

/// Runs snippet `name` (see `snippet_command`) with `ARGS...` to the end, off the runtime's thread
/// (the upstream and the gateway's answers need it). Panics, with the snippet's output, unless it
/// exits 0 having printed `token=N` and `status=N`.
async fn run_snippet(name: &str, args: Vec<String>) -> SnippetRun {
    run_snippet_with(name, args, &[]).await
}

/// [`run_snippet`] with `env` set for the snippet.
async fn run_snippet_with(name: &str, args: Vec<String>, env: &[(&str, &str)]) -> SnippetRun {
    let mut command = snippet_command(name);
    command.envs(env.iter().copied());
    let output = tokio::task::spawn_blocking(move || command.args(&args).output())
        .await
        .expect("the snippet's thread")
        .unwrap_or_else(|e| panic!("{name} could not be run ({e})"));
    let text = format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{name} failed: {text}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let printed = |field: &str| -> u64 {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{name} printed no {field}=N: {text}"))
    };
    SnippetRun {
        token: printed("token"),
        status: u16::try_from(printed("status")).expect("an HTTP status"),
        output: text,
    }
}

/// Panics, naming the fix, when python3 cannot import `module`.
fn require_python_module(module: &str, install: &str) {
    let imported = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .unwrap_or_else(|e| panic!("python3 could not be run ({e}); it runs the token snippets"));
    assert!(
        imported.status.success(),
        "python3 cannot import {module} ({}); {install}",
        String::from_utf8_lossy(&imported.stderr).trim()
    );
}

/// The upstream saw exactly these fenced writes of `/invoices/42`, in this order.
fn assert_written_with(upstream: &RecordingUpstream, tokens: &[u64]) {
    let seen: Vec<(String, String, Option<u64>)> = upstream
        .seen()
        .iter()
        .map(|s| (s.method.clone(), s.target.clone(), s.fence()))
        .collect();
    let expected: Vec<(String, String, Option<u64>)> = tokens
        .iter()
        .map(|t| ("PUT".to_owned(), "/invoices/42".to_owned(), Some(*t)))
        .collect();
    assert_eq!(seen, expected);
}

/// Two holders of one lock in turn, each writing once through a gateway with a fenced route on
/// the embedded store; then the first holder's token, which must be refused without reaching
/// the upstream.
async fn two_holders_then_a_zombie(name: &str, snippet_args: impl Fn(String) -> Vec<String>) {
    two_holders_then_a_zombie_with(name, &[], snippet_args).await;
}

/// [`two_holders_then_a_zombie`] with `env` set for the snippet.
async fn two_holders_then_a_zombie_with(
    name: &str,
    env: &[(&str, &str)],
    snippet_args: impl Fn(String) -> Vec<String>,
) {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let route = fenced_route("invoices", &upstream.url(), "enforce", "monotonic");
    let gateway = GatewayProcess::start(dir.path(), &route);
    let url = gateway.url("/invoices/42");

    let first = run_snippet_with(name, snippet_args(url.clone()), env).await;
    let second = run_snippet_with(name, snippet_args(url.clone()), env).await;
    assert_eq!(first.status, 200, "{}", first.output);
    assert_eq!(second.status, 200, "{}", second.output);
    assert!(
        second.token > first.token,
        "the lock's second grant must carry a higher token: {} then {}",
        first.token,
        second.token
    );
    assert_written_with(&upstream, &[first.token, second.token]);

    let zombie = send(
        "PUT",
        &url,
        &[("x-fence", &first.token.to_string())],
        "late",
    )
    .await;
    assert_eq!(zombie.status, 409);
    assert_eq!(zombie.problem_slug(), "stale-fence");
    assert_eq!(
        zombie.header("x-fence-current"),
        Some(second.token.to_string().as_str())
    );
    assert_written_with(&upstream, &[first.token, second.token]);
}

#[tokio::test]
async fn etcd_lock_snippet_writes_with_its_keys_create_revision() {
    etcd::with_prefix(|prefix| async move {
        let lock = format!("{prefix}locks/invoice/42");
        let args = |url: String| {
            vec![
                url,
                "--etcd".to_owned(),
                etcd::etcd_url(),
                "--lock".to_owned(),
                lock.clone(),
            ]
        };
        two_holders_then_a_zombie("etcd_lock.py", args).await;
        // Both released: revoking the lease deleted each holder's key.
        assert_eq!(
            etcd::keys_under(&format!("{lock}/")).await,
            Vec::<String>::new()
        );
    })
    .await;
}

#[tokio::test]
async fn postgres_lease_snippet_writes_with_the_rows_fence() {
    require_python_module(
        "psycopg",
        "run tests/upstreams/install.sh (scripts/test.sh does)",
    );
    let schema = unique_schema();
    let mut connection = sqlx::PgConnection::connect(TEST_POSTGRES_URL)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {TEST_POSTGRES_URL} is required: {e}"));
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut connection)
        .await
        .expect("create the test schema");
    let table = format!("{schema}.lock_leases");
    let args = move |url: String| {
        vec![
            url,
            "--dsn".to_owned(),
            TEST_POSTGRES_URL.to_owned(),
            "--table".to_owned(),
            table.clone(),
        ]
    };
    let outcome =
        tokio::spawn(async move { two_holders_then_a_zombie("pg_lease.py", args).await }).await;
    let row: Result<(i64, bool), sqlx::Error> = sqlx::query_as(&format!(
        "SELECT fence, expires_at <= now() FROM {schema}.lock_leases WHERE lock_key = 'locks/invoice/42'"
    ))
    .fetch_one(&mut connection)
    .await;
    drop_schema(&schema).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
    // The row keeps its counter, and the second holder's lease was released (expired).
    assert_eq!(row.expect("the lease row"), (2, true));
}

/// One holder through a route whose gateway follows the lock itself (`authority_toml`, with
/// `require_live_lease` and `strict`): its write is accepted with the snippet's token, and once it
/// has released the lock, neither its own token nor a made-up higher one reaches the upstream.
/// `strict`, because without it a write is judged by what the watch has seen so far, and the
/// release may not have reached it yet (the PostgreSQL table is read every 100 ms): the released
/// token was seen accepted that way (without `strict`, a loop of the PostgreSQL test failed so on
/// its 4th run).
async fn holder_followed_by_the_authority_watch(
    name: &str,
    authority_toml: &str,
    snippet_args: impl Fn(String) -> Vec<String>,
) {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let route = format!(
        "{}[routes.fence.authority]\n{authority_toml}require_live_lease = true\nstrict = true\n\n",
        fenced_route("invoices", &upstream.url(), "enforce", "monotonic")
    );
    let gateway = GatewayProcess::start(dir.path(), &route);
    let url = gateway.url("/invoices/42");

    let holder = run_snippet(name, snippet_args(url.clone())).await;
    assert_eq!(holder.status, 200, "{}", holder.output);
    assert_written_with(&upstream, &[holder.token]);

    let ended = send(
        "PUT",
        &url,
        &[("x-fence", &holder.token.to_string())],
        "late",
    )
    .await;
    assert_eq!(
        ended.status, 409,
        "the released holder's token: {:?}",
        ended.body
    );
    let forged = (holder.token + 1_000_000).to_string();
    let forged = send("PUT", &url, &[("x-fence", &forged)], "forged").await;
    assert_eq!(forged.status, 409);
    assert_eq!(forged.problem_slug(), "lease-ended");
    assert_written_with(&upstream, &[holder.token]);
}

#[tokio::test]
async fn etcd_lock_snippet_is_followed_by_the_authority_watch() {
    etcd::with_prefix(|prefix| async move {
        let authority = format!(
            "kind = \"etcd\"\nendpoints = [\"{}\"]\nlock_key = \"{prefix}locks/invoice/{{id}}\"\n",
            etcd::etcd_url()
        );
        let lock = format!("{prefix}locks/invoice/42");
        let args = |url: String| {
            vec![
                url,
                "--etcd".to_owned(),
                etcd::etcd_url(),
                "--lock".to_owned(),
                lock.clone(),
            ]
        };
        holder_followed_by_the_authority_watch("etcd_lock.py", &authority, args).await;
    })
    .await;
}

#[tokio::test]
async fn postgres_lease_snippet_is_followed_by_the_authority_watch() {
    require_python_module(
        "psycopg",
        "run tests/upstreams/install.sh (scripts/test.sh does)",
    );
    let schema = unique_schema();
    let mut connection = sqlx::PgConnection::connect(TEST_POSTGRES_URL)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {TEST_POSTGRES_URL} is required: {e}"));
    // The table exists before the gateway starts following it.
    for statement in [
        format!("CREATE SCHEMA {schema}"),
        format!(
            "CREATE TABLE {schema}.lock_leases (lock_key text PRIMARY KEY, owner text NOT NULL, \
             fence bigint NOT NULL, expires_at timestamptz NOT NULL)"
        ),
    ] {
        sqlx::query(&statement)
            .execute(&mut connection)
            .await
            .expect("create the lease table");
    }
    let table = format!("{schema}.lock_leases");
    let authority = format!(
        "kind = \"postgres\"\nurl = \"{TEST_POSTGRES_URL}\"\ntable = \"{table}\"\nlock_key = \"locks/invoice/{{id}}\"\n"
    );
    let args = move |url: String| {
        vec![
            url,
            "--dsn".to_owned(),
            TEST_POSTGRES_URL.to_owned(),
            "--table".to_owned(),
            table.clone(),
        ]
    };
    let outcome = tokio::spawn(async move {
        holder_followed_by_the_authority_watch("pg_lease.py", &authority, args).await
    })
    .await;
    drop_schema(&schema).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Runs `test` with a ZooKeeper root of its own (`/fencegate-test-<uuid>`), then deletes the
/// tree below it, whether the test passed or not. Fails, naming the server, without ZooKeeper.
async fn with_zookeeper_root<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let root = unique_root();
    let observer = zk_observer().await;
    let outcome = tokio::spawn(test(root.clone())).await;
    zk_delete_tree(&observer, &root).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// The arguments of the ZooKeeper snippets: `GATEWAY_URL --zk HOSTS --lock LOCK`.
fn zookeeper_snippet_args(lock: &str) -> impl Fn(String) -> Vec<String> + '_ {
    move |url| {
        vec![
            url,
            "--zk".to_owned(),
            ZK_HOSTS.to_owned(),
            "--lock".to_owned(),
            lock.to_owned(),
        ]
    }
}

/// Panics unless `lock` has no contender left: each holder released its node.
async fn assert_released(lock: &str) {
    let observer = zk_observer().await;
    assert_eq!(
        observer
            .list_children(lock)
            .await
            .unwrap_or_else(|e| panic!("listing {lock}: {e}")),
        Vec::<String>::new(),
        "{lock}: a holder's node is left"
    );
}

/// `two_holders_then_a_zombie` with ZooKeeper snippet `name` on `<root>/locks/invoice/42`.
async fn zookeeper_holders_then_a_zombie(name: &'static str) {
    with_zookeeper_root(|root| async move {
        let lock = format!("{root}/locks/invoice/42");
        two_holders_then_a_zombie(name, zookeeper_snippet_args(&lock)).await;
        assert_released(&lock).await;
    })
    .await;
}

/// `holder_followed_by_the_authority_watch` with ZooKeeper snippet `name` on
/// `<root>/locks/invoice/42`, through a route whose authority follows `<root>/locks/invoice/{id}`
/// (`token = "sequence"`: the holder's sequence number, which is what the snippets print).
async fn zookeeper_holder_followed_by_the_authority(name: &'static str) {
    with_zookeeper_root(|root| async move {
        let authority = format!(
            "kind = \"zookeeper\"\nhosts = \"{ZK_HOSTS}\"\n\
             lock_key = \"{root}/locks/invoice/{{id}}\"\ntoken = \"sequence\"\n"
        );
        let lock = format!("{root}/locks/invoice/42");
        holder_followed_by_the_authority_watch(name, &authority, zookeeper_snippet_args(&lock))
            .await;
        assert_released(&lock).await;
    })
    .await;
}

#[tokio::test]
async fn zookeeper_lock_snippet_writes_with_its_nodes_sequence_number() {
    require_python_module("kazoo", KAZOO_INSTALL);
    zookeeper_holders_then_a_zombie("zk_lock.py").await;
}

#[tokio::test]
async fn zookeeper_lock_snippet_is_followed_by_the_zookeeper_authority() {
    require_python_module("kazoo", KAZOO_INSTALL);
    zookeeper_holder_followed_by_the_authority("zk_lock.py").await;
}

#[tokio::test]
async fn kazoo_lock_recipe_writes_with_its_nodes_sequence_number() {
    require_python_module("kazoo", KAZOO_INSTALL);
    zookeeper_holders_then_a_zombie("kazoo_lock.py").await;
}

#[tokio::test]
async fn kazoo_lock_recipe_is_followed_by_the_zookeeper_authority() {
    require_python_module("kazoo", KAZOO_INSTALL);
    zookeeper_holder_followed_by_the_authority("kazoo_lock.py").await;
}

#[tokio::test]
async fn curator_mutex_snippet_writes_with_its_nodes_sequence_number() {
    zookeeper_holders_then_a_zombie("CuratorLock.java").await;
}

#[tokio::test]
async fn curator_mutex_snippet_is_followed_by_the_zookeeper_authority() {
    zookeeper_holder_followed_by_the_authority("CuratorLock.java").await;
}

#[tokio::test]
async fn zookeeper_worker_example_writes_with_its_nodes_sequence_number() {
    with_zookeeper_root(|root| async move {
        let lock = format!("{root}/locks/invoice/42");
        two_holders_then_a_zombie("zk_worker", zookeeper_snippet_args(&lock)).await;
        // Both released: each worker deleted its node.
        assert_released(&lock).await;
    })
    .await;
}

#[tokio::test]
async fn redis_lock_snippet_writes_with_its_counters_value() {
    require_python_module(
        "redis",
        "run tests/upstreams/install.sh (scripts/test.sh does)",
    );
    let lock = format!(
        "fencegate-test:{}:locks:invoice:42",
        uuid::Uuid::new_v4().simple()
    );
    let args = |url: String| {
        vec![
            url,
            "--redis".to_owned(),
            "redis://127.0.0.1:6379/0".to_owned(),
            "--lock".to_owned(),
            lock.clone(),
        ]
    };
    two_holders_then_a_zombie("redis_lock.py", args).await;
    // Both released: the lock is free, and its counter stays for the next grant.
    let client = redis::Client::open("redis://127.0.0.1:6379/0").expect("a Redis URL");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis at 127.0.0.1:6379 is required: {e}"));
    let held: Option<String> = redis::cmd("GET")
        .arg(&lock)
        .query_async(&mut connection)
        .await
        .expect("GET the lock");
    assert_eq!(held, None, "the second holder released the lock");
    let _: i64 = redis::cmd("DEL")
        .arg(&lock)
        .arg(format!("{lock}:fence"))
        .query_async(&mut connection)
        .await
        .expect("DEL the test's keys");
}

/// The DynamoDB snippet against moto's emulation of DynamoDB (`python3 -m moto.server`), the only
/// DynamoDB this project can run: it shows the snippet's conditional counter as moto implements
/// DynamoDB's update expressions, not DynamoDB itself.
#[tokio::test]
async fn dynamodb_lock_snippet_writes_with_its_items_fence_on_moto() {
    require_python_module(
        "moto.server",
        "run tests/upstreams/install.sh (scripts/test.sh does)",
    );
    require_python_module(
        "boto3",
        "run tests/upstreams/install.sh (scripts/test.sh does)",
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let mut moto = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 -m moto.server");
    let endpoint = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "moto's server did not listen on {endpoint}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let env = [
        ("AWS_ACCESS_KEY_ID", "fencegate-test"),
        ("AWS_SECRET_ACCESS_KEY", "fencegate-test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ];
    let args = move |url: String| {
        vec![
            url,
            "--endpoint-url".to_owned(),
            endpoint.clone(),
            "--table".to_owned(),
            "locks".to_owned(),
        ]
    };
    let outcome = tokio::spawn({
        let env = env.map(|(k, v)| (k.to_owned(), v.to_owned()));
        async move {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            two_holders_then_a_zombie_with("dynamodb_lock.py", &env, args).await;
        }
    })
    .await;
    let _ = moto.kill();
    let _ = moto.wait();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
