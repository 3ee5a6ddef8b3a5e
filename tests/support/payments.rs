//! Adyen, PayPal and Square end to end (`tests/upstreams/`): the fake provider
//! `fake_payments.py` in one dialect as a child process with its record of charges and requests,
//! and runs of `payments_client.py`, which drives the provider's official Python library.
//! `scripts/test.sh` installs the libraries (`tests/upstreams/install-payments.sh`); without
//! them the tests fail and say so.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::stripe::{read_all, read_lines, upstreams_dir};

/// How long the fake provider may take to print its port.
const PROVIDER_STARTUP: Duration = Duration::from_secs(20);
/// How long one client run may take.
const CLIENT_RUN_LIMIT: Duration = Duration::from_secs(120);

/// The three providers, as the fake and the client name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Adyen,
    PayPal,
    Square,
}

impl Dialect {
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Adyen => "adyen",
            Dialect::PayPal => "paypal",
            Dialect::Square => "square",
        }
    }

    /// The Python module of the provider's library.
    fn module(self) -> &'static str {
        match self {
            Dialect::Adyen => "Adyen",
            Dialect::PayPal => "paypalserversdk",
            Dialect::Square => "square",
        }
    }
}

/// Panics, naming the install script, unless python3 can import the provider's library.
pub fn require_library(dialect: Dialect) {
    let output = Command::new("python3")
        .args(["-c", &format!("import {}", dialect.module())])
        .output();
    match output {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "python3 cannot import {} ({}); run tests/upstreams/install.sh (scripts/test.sh does)",
            dialect.module(),
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(e) => panic!("python3 could not be run ({e}); run tests/upstreams/install.sh"),
    }
}

/// What the fake provider does; see `tests/upstreams/fake_payments.py`.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    pub honour_keys: bool,
    /// Charged, then the connection reset without an answer: the first time only.
    pub drop_after_charge: Vec<String>,
    /// Answered 429 with `Retry-After: 1`, nothing charged: the first time only.
    pub rate_limit_first: Vec<String>,
    /// The credentials it serves: `--api-key` (Adyen), `--access-token` (Square), or
    /// `--client-id` and `--client-secret` (PayPal).
    pub credentials: Vec<(String, String)>,
}

/// One charge in the provider's record.
#[derive(Debug, Clone)]
pub struct Charge {
    pub operation: String,
    pub charge: String,
    pub idempotency_key: Option<String>,
}

pub struct FakePayments {
    child: Child,
    pub port: u16,
    record: PathBuf,
    requests: PathBuf,
}

impl FakePayments {
    /// Starts the provider over TLS with `cert` and `key`, its record files in `dir`.
    pub fn start(
        dialect: Dialect,
        dir: &Path,
        cert: &Path,
        key: &Path,
        behaviour: &Behaviour,
    ) -> FakePayments {
        let record = dir.join("provider-charges.jsonl");
        let requests = dir.join("provider-requests.jsonl");
        let mut command = Command::new("python3");
        command
            .arg(upstreams_dir().join("fake_payments.py"))
            .args(["--dialect", dialect.name()])
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key)
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
            .args(["--rate-limit-first", &behaviour.rate_limit_first.join(",")]);
        for (flag, value) in &behaviour.credentials {
            command.args([flag, value]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 could not be run ({e})"));
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
        FakePayments {
            child,
            port,
            record,
            requests,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn charges(&self) -> Vec<Charge> {
        read_lines(&self.record)
            .into_iter()
            .map(|line| Charge {
                operation: line["operation"].as_str().unwrap_or_default().to_owned(),
                charge: line["charge"].as_str().unwrap_or_default().to_owned(),
                idempotency_key: line["idempotency_key"].as_str().map(str::to_owned),
            })
            .collect()
    }

    /// How many times each operation was charged.
    pub fn charges_per_operation(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for charge in self.charges() {
            *counts.entry(charge.operation).or_insert(0) += 1;
        }
        counts
    }

    /// Every request the provider received (token requests included), with its outcome.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        read_lines(&self.requests)
    }
}

impl Drop for FakePayments {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A run of `tests/upstreams/payments_client.py`.
pub struct PaymentsRun {
    pub dialect: Dialect,
    /// The gateway, `http://127.0.0.1:PORT`.
    pub base: String,
    /// The client's placeholder credential, which the gateway replaces.
    pub credential: String,
    pub operations: Vec<String>,
    /// Calls per operation, made at once.
    pub duplicates: usize,
    /// The library's own retries (Adyen's has none: 0).
    pub retries: usize,
}

/// What one call of the library ended with.
#[derive(Debug, Clone)]
pub struct Call {
    pub operation: String,
    pub ok: bool,
    pub charge: Option<String>,
    /// The type of the gateway's problem document, when the call ended with one.
    pub problem: Option<String>,
    pub line: serde_json::Value,
}

impl PaymentsRun {
    /// Runs the client to its end; one result per call.
    pub fn run(&self) -> Vec<Call> {
        let mut child = Command::new("python3")
            .arg(upstreams_dir().join("payments_client.py"))
            .args(["--dialect", self.dialect.name()])
            .args(["--base", &self.base])
            .args(["--credential", &self.credential])
            .args(["--operations", &self.operations.join(",")])
            .args(["--duplicates", &self.duplicates.to_string()])
            .args(["--retries", &self.retries.to_string()])
            .args(["--timeout", "10"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 could not be run ({e})"));
        let stdout = child.stdout.take().map(read_all);
        let stderr = child.stderr.take().map(read_all);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("poll the client") {
                break status;
            }
            if started.elapsed() > CLIENT_RUN_LIMIT {
                let _ = child.kill();
                panic!("the client run took longer than {CLIENT_RUN_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let collect = |pipe: Option<std::thread::JoinHandle<String>>| {
            pipe.map(|p| p.join().expect("a pipe reader"))
                .unwrap_or_default()
        };
        let stdout = collect(stdout);
        let stderr = collect(stderr);
        assert!(
            status.success(),
            "the {} client failed ({status}): {stderr}",
            self.dialect.name()
        );
        stdout
            .lines()
            .map(|line| {
                let line: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
                Call {
                    operation: line["operation"].as_str().unwrap_or_default().to_owned(),
                    ok: line["ok"].as_bool().unwrap_or(false),
                    charge: line["charge"].as_str().map(str::to_owned),
                    problem: line["problem"].as_str().map(str::to_owned),
                    line,
                }
            })
            .collect()
    }
}
