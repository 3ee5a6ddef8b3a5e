//! The client snippets of docs/getting-tokens.md run as shipped against the real binary: each takes
//! its lock, prints its token and writes once; later holders' tokens are higher, earlier ones are
//! refused, and routes that follow the lock service refuse released and made-up tokens.

mod dynamodb;
mod etcd_postgres;
mod java;
mod redis;
mod zookeeper;

use std::path::PathBuf;
use std::process::Command;

use crate::support::gateway::fenced_route;
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream};
use java::{compiled_java_snippets, java_class_path, SLF4J_LEVEL};

/// What to run when a Python package is missing.
const PYTHON_INSTALL: &str = "run tests/upstreams/install.sh (scripts/test.sh does)";

/// What one run of a snippet printed, and how it ended.
pub(super) struct SnippetRun {
    token: u64,
    status: u16,
    output: String,
}

pub(super) fn snippet_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/tokens")
        .join(name)
}

/// The command that runs snippet `name`: `python3 examples/tokens/NAME` for a Python one,
/// `java CLASS` for `CLASS.java` (compiled by [`compiled_java_snippets`]), else the example
/// `NAME` through the cargo running the tests (`cargo run --example NAME`, which builds it first
/// when it is not up to date: `cargo test --test process` does not build examples).
pub(super) fn snippet_command(name: &str) -> Command {
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

/// Whether cargo sets `variable` for the test binaries it runs (they describe this package).
pub(super) fn set_by_cargo_for_this_test(variable: &str) -> bool {
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
pub(super) async fn run_snippet(name: &str, args: Vec<String>) -> SnippetRun {
    run_snippet_with(name, args, &[]).await
}

/// [`run_snippet`] with `env` set for the snippet.
pub(super) async fn run_snippet_with(
    name: &str,
    args: Vec<String>,
    env: &[(&str, &str)],
) -> SnippetRun {
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
pub(super) fn require_python_module(module: &str, install: &str) {
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
pub(super) fn assert_written_with(upstream: &RecordingUpstream, tokens: &[u64]) {
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
pub(super) async fn two_holders_then_a_zombie(
    name: &str,
    snippet_args: impl Fn(String) -> Vec<String>,
) {
    two_holders_then_a_zombie_with(name, &[], snippet_args).await;
}

/// [`two_holders_then_a_zombie`] with `env` set for the snippet.
pub(super) async fn two_holders_then_a_zombie_with(
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

/// One holder through a route whose gateway follows the lock itself (`authority_toml`, with
/// `require_live_lease` and `strict`): its write is accepted with the snippet's token, and once it
/// has released the lock, neither its own token nor a made-up higher one reaches the upstream.
/// `strict`, because without it a write is judged by what the watch has seen so far, and the
/// release may not have reached it yet (the PostgreSQL table is read every 100 ms): the released
/// token was seen accepted that way (without `strict`, a loop of the PostgreSQL test failed so on
/// its 4th run).
pub(super) async fn holder_followed_by_the_authority_watch(
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
