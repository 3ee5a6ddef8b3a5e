//! A real payment client end to end (`tests/upstreams/`): the fake Stripe provider as a child
//! process with its record of charges and requests, and runs of the client that drives the
//! official `stripe` Python library. `scripts/test.sh` installs the library
//! (`tests/upstreams/install.sh`); without it the tests fail and say so.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the fake provider may take to print its port.
const PROVIDER_STARTUP: Duration = Duration::from_secs(20);
/// How long one client run may take, retries and a gateway restart included.
const CLIENT_RUN_LIMIT: Duration = Duration::from_secs(120);

pub fn upstreams_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstreams")
}

/// Panics, naming the install script, unless python3 can import the `stripe` library.
pub fn require_stripe_library() {
    let output = Command::new("python3")
        .args(["-c", "import stripe; print(stripe.VERSION)"])
        .output();
    match output {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "python3 cannot import the stripe library ({}); run tests/upstreams/install.sh (scripts/test.sh does)",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(e) => panic!(
            "python3 could not be run ({e}); run tests/upstreams/install.sh (scripts/test.sh does)"
        ),
    }
}

/// What the fake provider does; see `tests/upstreams/fake_provider.py`.
#[derive(Debug, Clone, Default)]
pub struct ProviderBehaviour {
    /// A repeated `Idempotency-Key` gets the stored answer (Stripe), or is charged again.
    pub honour_keys: bool,
    /// Charged, then the connection reset without an answer: the first time only.
    pub drop_after_charge: Vec<String>,
    /// Answered 500 without a charge: the first time only.
    pub fail_before_charge: Vec<String>,
    /// Charged, then answered after this long: the first time only.
    pub slow: Vec<(String, f64)>,
}

/// One charge in the provider's record.
#[derive(Debug, Clone)]
pub struct Charge {
    pub payout: String,
    pub charge: String,
    pub idempotency_key: Option<String>,
    /// The answer the provider sent (or would have: dropped ones were never sent).
    pub response: serde_json::Value,
}

pub struct FakeProvider {
    child: Child,
    pub port: u16,
    record: PathBuf,
    requests: PathBuf,
}

impl FakeProvider {
    /// Starts the provider with its certificate and key, serving only `Bearer {secret}`, its
    /// record files in `dir`.
    pub fn start(
        dir: &Path,
        cert: &Path,
        key: &Path,
        secret: &str,
        behaviour: &ProviderBehaviour,
    ) -> FakeProvider {
        let record = dir.join("provider-charges.jsonl");
        let requests = dir.join("provider-requests.jsonl");
        let slow = behaviour
            .slow
            .iter()
            .map(|(payout, seconds)| format!("{payout}={seconds}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut child = Command::new("python3")
            .arg(upstreams_dir().join("fake_provider.py"))
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key)
            .args(["--secret", secret])
            .arg("--record")
            .arg(&record)
            .arg("--requests")
            .arg(&requests)
            .arg(if behaviour.honour_keys {
                "--honour-keys"
            } else {
                "--ignore-keys"
            })
            .args([
                "--drop-after-charge",
                &behaviour.drop_after_charge.join(","),
            ])
            .args([
                "--fail-before-charge",
                &behaviour.fail_before_charge.join(","),
            ])
            .args(["--slow", &slow])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("python3 could not be run ({e}); run tests/upstreams/install.sh")
            });
        let stdout = child.stdout.take().expect("the provider's stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(PROVIDER_STARTUP).unwrap_or_else(|_| {
            panic!("the fake provider printed no port within {PROVIDER_STARTUP:?}")
        });
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the fake provider did not start: {line:?}"));
        FakeProvider {
            child,
            port,
            record,
            requests,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Every charge made so far, in order.
    pub fn charges(&self) -> Vec<Charge> {
        read_lines(&self.record)
            .into_iter()
            .map(|line| Charge {
                payout: line["payout"].as_str().unwrap_or_default().to_owned(),
                charge: line["charge"].as_str().unwrap_or_default().to_owned(),
                idempotency_key: line["idempotency_key"].as_str().map(str::to_owned),
                response: line["response"].clone(),
            })
            .collect()
    }

    /// How many times each payout was charged.
    pub fn charges_per_payout(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for charge in self.charges() {
            *counts.entry(charge.payout).or_insert(0) += 1;
        }
        counts
    }

    /// Every request the provider received: method, path, payout, the `Authorization` and
    /// `Idempotency-Key` headers as received, and its outcome.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        read_lines(&self.requests)
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// A run of `tests/upstreams/stripe_client.py`.
pub struct ClientRun {
    /// The gateway, `https://localhost:PORT`.
    pub base: String,
    pub ca_file: PathBuf,
    /// The client's own API key, which the gateway replaces.
    pub api_key: String,
    pub payouts: Vec<String>,
    /// Calls per payout, made at once.
    pub duplicates: usize,
    /// `stripe.max_network_retries`.
    pub retries: usize,
}

/// What one call of the library ended with.
#[derive(Debug, Clone)]
pub struct CallResult {
    pub payout: String,
    pub ok: bool,
    pub charge: Option<String>,
    /// The type of the gateway's problem document, when the call ended with one.
    pub problem: Option<String>,
    /// The status (or "connection-error") of every attempt the library made.
    pub attempts: Vec<serde_json::Value>,
    pub line: serde_json::Value,
}

/// A client run in progress.
pub struct RunningClient {
    child: Child,
    started: Instant,
    /// Read on threads of their own, so that a full pipe never stalls the client.
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

pub fn read_all(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

impl ClientRun {
    pub fn spawn(&self) -> RunningClient {
        let mut child = Command::new("python3")
            .arg(upstreams_dir().join("stripe_client.py"))
            .args(["--base", &self.base])
            .arg("--ca")
            .arg(&self.ca_file)
            .args(["--api-key", &self.api_key])
            .args(["--payouts", &self.payouts.join(",")])
            .args(["--duplicates", &self.duplicates.to_string()])
            .args(["--retries", &self.retries.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("python3 could not be run ({e}); run tests/upstreams/install.sh")
            });
        let stdout = child.stdout.take().map(read_all);
        let stderr = child.stderr.take().map(read_all);
        RunningClient {
            child,
            started: Instant::now(),
            stdout,
            stderr,
        }
    }

    pub fn run(&self) -> Vec<CallResult> {
        self.spawn().finish()
    }
}

impl RunningClient {
    /// Waits for the run to end; one result per call.
    pub fn finish(mut self) -> Vec<CallResult> {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("poll the client") {
                break status;
            }
            assert!(
                self.started.elapsed() < CLIENT_RUN_LIMIT,
                "the client run took longer than {CLIENT_RUN_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let collect = |pipe: Option<std::thread::JoinHandle<String>>| {
            pipe.map(|p| p.join().expect("a pipe reader"))
                .unwrap_or_default()
        };
        let stdout = collect(self.stdout.take());
        let stderr = collect(self.stderr.take());
        assert!(
            status.success(),
            "the stripe client failed ({status}): {stderr}"
        );
        stdout
            .lines()
            .map(|line| {
                let line: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
                CallResult {
                    payout: line["payout"].as_str().unwrap_or_default().to_owned(),
                    ok: line["ok"].as_bool().unwrap_or(false),
                    charge: line["charge"].as_str().map(str::to_owned),
                    problem: line["problem"].as_str().map(str::to_owned),
                    attempts: line["attempts"].as_array().cloned().unwrap_or_default(),
                    line,
                }
            })
            .collect()
    }
}

impl Drop for RunningClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
