//! The README's walk-through as a new user runs it: `examples/ledger.py` as the upstream and the
//! binary on `config/fencegate.toml` (only its addresses and data directory moved), then the
//! walk-through's requests, each with the answer the README promises, and the ledger's own log
//! showing that the stale writes never arrived.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::process::{free_port, GatewayProcess};
use crate::support::send;

const README: &str = include_str!("../../README.md");

/// The ledger, started as the README starts it, on `addr`; its stdout lines are collected.
struct Ledger {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Ledger {
    fn start(addr: std::net::SocketAddr) -> Ledger {
        let mut child = Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/ledger.py"))
            .arg(addr.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs examples/ledger.py");
        let stdout = child.stdout.take().expect("the ledger's stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                kept.lock().expect("lines lock").push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "the ledger did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ledger { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines lock").clone()
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_walk_through_answers_as_written() {
    for command in [
        "python3 examples/ledger.py &",
        "cargo run --release -- serve --config config/fencegate.toml &",
        "curl -i -X PUT localhost:8080/invoices/72 -H 'X-Fence: 33' -d 'draft by A'",
        "curl -i -X PUT localhost:8080/invoices/72 -H 'X-Fence: 34' -d 'final by B'",
        "curl -i -X PUT localhost:8080/invoices/72 -H 'X-Fence: 33' -d 'stale by A'",
        "curl -i -X POST localhost:8080/_fencegate/claim/invoice:72 -H 'X-Fence: 35'",
        "curl -i -X PUT localhost:8080/invoices/72 -H 'X-Fence: 34' -d 'late by B'",
    ] {
        assert!(
            README.contains(command),
            "the README's walk-through no longer runs {command:?}"
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (gateway, upstream, admin) = (free_port(), free_port(), free_port());
    let ledger = Ledger::start(upstream);
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/fencegate.toml"
    ))
    .expect("read config/fencegate.toml");
    let data = dir.path().display().to_string();
    let config = shipped
        .replace("127.0.0.1:8080", &gateway.to_string())
        .replace("127.0.0.1:9000", &upstream.to_string())
        .replace("127.0.0.1:9090", &admin.to_string())
        .replace("state_dir = \"data\"", &format!("state_dir = \"{data}\""))
        .replace("\"data/fencegate.db\"", &format!("\"{data}/fencegate.db\""));
    let file = dir.path().join("fencegate.toml");
    std::fs::write(&file, config).expect("write the config");
    let process = GatewayProcess::serve_file(&file, gateway, &[]);
    let url = process.url("/invoices/72");

    let draft = send("PUT", &url, &[("x-fence", "33")], "draft by A").await;
    assert_eq!(draft.status, 200, "{draft:?}");
    let last = send("PUT", &url, &[("x-fence", "34")], "final by B").await;
    assert_eq!(last.status, 200, "{last:?}");
    let stale = send("PUT", &url, &[("x-fence", "33")], "stale by A").await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(stale.headers["x-fence-current"], "34");
    let problem = stale.json();
    assert_eq!(
        problem["type"],
        "https://fencegate.dev/problems/stale-fence"
    );
    assert_eq!(
        problem["detail"],
        "route invoices: key invoice:72: token 33 is below the high-water mark 34"
    );
    let claim = send(
        "POST",
        &process.url("/_fencegate/claim/invoice:72"),
        &[("x-fence", "35")],
        "",
    )
    .await;
    assert_eq!(claim.status, 200, "{claim:?}");
    assert_eq!(
        claim.json(),
        serde_json::json!({"key": "invoice:72", "fence": 35, "previous": 34})
    );
    let late = send("PUT", &url, &[("x-fence", "34")], "late by B").await;
    assert_eq!(late.status, 409, "{late:?}");
    assert_eq!(late.headers["x-fence-current"], "35");
    let read = send("GET", &url, &[], "").await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(&read.body[..], b"final by B");

    let status = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .expect("terminate task");
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(
        ledger.lines(),
        [
            format!("ledger listening on http://{upstream}"),
            "write /invoices/72 fence=33 body=draft by A".to_owned(),
            "write /invoices/72 fence=34 body=final by B".to_owned(),
        ],
        "the ledger saw exactly the two accepted writes"
    );
}
