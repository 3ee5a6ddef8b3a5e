//! The client snippets of docs/getting-tokens.md run as shipped: each takes its lock, prints the
//! fencing token the lock service gave it and writes once through the real binary, and the
//! upstream receives that write carrying that token; a second holder gets a higher token, after
//! which the first one's token is refused; and through a route that follows the lock itself (the
//! authority watch), the released holder's token and a made-up one are refused. The etcd and
//! PostgreSQL snippets need the machine's etcd (127.0.0.1:2379) and PostgreSQL (127.0.0.1:5432)
//! and fail when either is missing; the PostgreSQL one needs psycopg (`tests/upstreams/install.sh`).
//! The ZooKeeper snippet needs ZooKeeper at 127.0.0.1:2181 (scripts/zookeeper-setup.sh) and kazoo
//! (`tests/upstreams/install.sh`), and fails without them; so does the Rust ZooKeeper worker
//! (examples/zk_worker.rs, run by `cargo run --example`), without ZooKeeper.

use std::path::PathBuf;
use std::process::Command;

use sqlx::Connection as _;

use crate::support::gateway::fenced_route;
use crate::support::postgres::{drop_schema, unique_schema, TEST_POSTGRES_URL};
use crate::support::{etcd, send, Behavior, GatewayProcess, RecordingUpstream};

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

/// The command that runs snippet `name`: `python3 examples/tokens/NAME` for a Python one, else
/// the example `NAME` through the cargo running the tests (`cargo run --example NAME`, which builds
/// it first when it is not up to date: `cargo test --test process` does not build examples).
fn snippet_command(name: &str) -> Command {
    if name.ends_with(".py") {
        let mut python = Command::new("python3");
        python.arg(snippet_path(name));
        python
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
    let mut command = snippet_command(name);
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
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let route = fenced_route("invoices", &upstream.url(), "enforce", "monotonic");
    let gateway = GatewayProcess::start(dir.path(), &route);
    let url = gateway.url("/invoices/42");

    let first = run_snippet(name, snippet_args(url.clone())).await;
    let second = run_snippet(name, snippet_args(url.clone())).await;
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

#[tokio::test]
async fn zookeeper_lock_snippet_writes_with_its_nodes_sequence_number() {
    require_python_module("kazoo", "pip install kazoo");
    let parent = format!("/fencegate-test/{}/locks/invoice/42", uuid::Uuid::new_v4());
    let args = |url: String| vec![url, "--lock".to_owned(), parent.clone()];
    two_holders_then_a_zombie("zk_lock.py", args).await;
}

#[tokio::test]
async fn zookeeper_worker_example_writes_with_its_nodes_sequence_number() {
    let parent = format!("/fencegate-test/{}/locks/invoice/42", uuid::Uuid::new_v4());
    let args = |url: String| vec![url, "--lock".to_owned(), parent.clone()];
    two_holders_then_a_zombie("zk_worker", args).await;
    // Both released: each worker deleted its node.
    let zk = zookeeper_client::Client::connect("127.0.0.1:2181")
        .await
        .unwrap_or_else(|e| panic!("ZooKeeper at 127.0.0.1:2181 is required: {e}"));
    assert_eq!(
        zk.list_children(&parent).await.expect("the lock parent"),
        Vec::<String>::new()
    );
}
