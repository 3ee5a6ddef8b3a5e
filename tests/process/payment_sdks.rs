//! Adyen, PayPal and Square end to end: each provider's official Python library (`adyen`,
//! `paypal-server-sdk`, `squareup`) through the real binary, configured by the shipped
//! `config/{adyen,paypal,square}.toml`, over TLS to a fake of the provider that charges then
//! resets the connection, answers 429 before charging, and honours or ignores idempotency keys.
//! Counted on the provider's record, every operation is charged exactly once — across duplicate
//! calls at once, the application's retries and the faults — with the provider's credentials
//! held by the gateway alone (PayPal's an OAuth2 token it obtains itself). The same calls
//! without `[routes.idempotency]` charge twice, which shows the check can fail.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::support::payments::{
    require_library, Behaviour, Call, Dialect, FakePayments, PaymentsRun,
};
use crate::support::process::{free_port, stderr_path};
use crate::support::tls::{write, TestCa};
use crate::support::GatewayProcess;

/// The provider's secret (Adyen's API key, Square's access token, PayPal's client secret): only
/// the gateway and the provider hold it.
const SECRET: &str = "provider-secret-held-by-the-gateway";
const PAYPAL_CLIENT_ID: &str = "paypal-client-id";
/// What the library is configured with; the gateway replaces it.
const PLACEHOLDER: &str = "client-placeholder-credential";
const OPERATIONS: [&str; 4] = ["op1", "op2", "op3", "op4"];
/// Charged, then the connection reset without an answer (first time only).
const DROPPED: &str = "op2";
/// Answered 429 without a charge (first time only).
const LIMITED: &str = "op3";

/// What the shipped configuration's `[routes.idempotency]` becomes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Idempotency {
    /// As shipped: `on_unknown_outcome = "hold"`.
    Hold,
    Resubmit,
    /// No `[routes.idempotency]` table.
    Absent,
}

struct Bench {
    dialect: Dialect,
    dir: tempfile::TempDir,
    config: PathBuf,
    addr: SocketAddr,
    provider: FakePayments,
}

impl Bench {
    fn new(dialect: Dialect, honour_keys: bool, idempotency: Idempotency) -> Bench {
        require_library(dialect);
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("payments end-to-end CA");
        let ca_file = write(dir.path(), "ca.crt", &ca.pem);
        let (cert, key) = ca
            .leaf(&["localhost", "127.0.0.1"])
            .write(dir.path(), "provider");
        let credentials = match dialect {
            Dialect::Adyen => vec![("--api-key".to_owned(), SECRET.to_owned())],
            Dialect::Square => vec![("--access-token".to_owned(), SECRET.to_owned())],
            Dialect::PayPal => vec![
                ("--client-id".to_owned(), PAYPAL_CLIENT_ID.to_owned()),
                ("--client-secret".to_owned(), SECRET.to_owned()),
            ],
        };
        let behaviour = Behaviour {
            honour_keys,
            drop_after_charge: vec![DROPPED.to_owned()],
            rate_limit_first: vec![LIMITED.to_owned()],
            credentials,
        };
        let provider = FakePayments::start(dialect, dir.path(), &cert, &key, &behaviour);
        let addr = free_port();
        let text = shipped_config_for_test(
            dialect,
            dir.path(),
            addr,
            &ca_file,
            &provider.url(),
            idempotency,
        );
        let config = write(dir.path(), "fencegate.toml", &text);
        Bench {
            dialect,
            dir,
            config,
            addr,
            provider,
        }
    }

    fn start_gateway(&self) -> GatewayProcess {
        let env: &[(&str, &str)] = match self.dialect {
            Dialect::Adyen => &[("ADYEN_API_KEY", SECRET)],
            Dialect::Square => &[("SQUARE_ACCESS_TOKEN", SECRET)],
            Dialect::PayPal => &[
                ("PAYPAL_CLIENT_ID", PAYPAL_CLIENT_ID),
                ("PAYPAL_CLIENT_SECRET", SECRET),
            ],
        };
        GatewayProcess::serve_file(&self.config, self.addr, env)
    }

    /// `duplicates` calls of each operation at once, the library's own retries as far as it has
    /// them (PayPal's must be asked for; Square's do not retry a reset; Adyen's has none).
    fn run(&self, duplicates: usize) -> Vec<Call> {
        let results = PaymentsRun {
            dialect: self.dialect,
            base: format!("http://127.0.0.1:{}", self.addr.port()),
            credential: PLACEHOLDER.to_owned(),
            operations: OPERATIONS.iter().map(|o| (*o).to_owned()).collect(),
            duplicates,
            retries: 0,
        }
        .run();
        for call in &results {
            eprintln!("{}: {}", self.dialect.name(), call.line);
        }
        results
    }

    /// Charges per operation, 0 for one never charged.
    fn counts(&self) -> BTreeMap<String, usize> {
        let mut counts = self.provider.charges_per_operation();
        for operation in OPERATIONS {
            counts.entry(operation.to_owned()).or_insert(0);
        }
        counts
    }

    /// Each call of `operations` was answered with the one charge the provider made for it.
    fn assert_answered_with_the_charge(&self, calls: &[Call], operations: &[&str]) {
        let charges = self.provider.charges();
        for call in calls
            .iter()
            .filter(|c| operations.contains(&c.operation.as_str()))
        {
            assert!(
                call.ok,
                "{}: not answered with a charge: {}",
                self.dialect.name(),
                call.line
            );
            let made: Vec<_> = charges
                .iter()
                .filter(|c| c.operation == call.operation)
                .collect();
            assert_eq!(made.len(), 1, "{}: {made:?}", call.operation);
            assert_eq!(
                call.charge.as_deref(),
                Some(made[0].charge.as_str()),
                "{}",
                call.line
            );
        }
    }

    /// The provider saw only the gateway's credentials, and each operation under one key of its
    /// own, a UUID.
    fn assert_credentials_and_keys(&self) {
        let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut grants = 0;
        for request in self.provider.requests() {
            if request["outcome"] == "token-issued" {
                grants += 1;
                continue;
            }
            let presented = match self.dialect {
                Dialect::Adyen => request["api_key"].as_str(),
                _ => request["authorization"].as_str(),
            }
            .unwrap_or_default()
            .to_owned();
            assert!(
                !presented.contains(PLACEHOLDER),
                "the client's credential reached the provider: {request}"
            );
            match self.dialect {
                Dialect::Adyen => assert_eq!(presented, SECRET),
                Dialect::Square => assert_eq!(presented, format!("Bearer {SECRET}")),
                Dialect::PayPal => assert!(presented.starts_with("Bearer A21AA"), "{request}"),
            }
            let operation = request["operation"].as_str().unwrap_or_default().to_owned();
            let key = request["idempotency_key"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            keys.entry(operation).or_default().insert(key);
        }
        assert_eq!(
            grants > 0,
            self.dialect == Dialect::PayPal,
            "token grants: {grants}"
        );
        let mut all = BTreeSet::new();
        for (operation, seen) in &keys {
            assert_eq!(
                seen.len(),
                1,
                "{operation} reached the provider under {seen:?}"
            );
            let key = seen.iter().next().unwrap();
            assert!(
                uuid::Uuid::parse_str(key).is_ok() && key.len() == 36,
                "{operation}: {key:?}"
            );
            assert!(all.insert(key.clone()), "{operation} shares its key {key}");
        }
    }

    fn gateway_log(&self) -> String {
        std::fs::read_to_string(stderr_path(self.dir.path())).unwrap_or_default()
    }
}

/// `config/{dialect}.toml` as shipped, with what a test must change: addresses and directories,
/// the admin token inline, the fake provider and its CA instead of the provider's hosts, a
/// shorter route timeout, and the idempotency variant.
fn shipped_config_for_test(
    dialect: Dialect,
    dir: &Path,
    addr: SocketAddr,
    ca_file: &Path,
    provider: &str,
    idempotency: Idempotency,
) -> String {
    let file = format!(
        "{}/config/{}.toml",
        env!("CARGO_MANIFEST_DIR"),
        dialect.name()
    );
    let mut text = std::fs::read_to_string(&file).expect("read the shipped config");
    let host = match dialect {
        Dialect::Adyen => "https://checkout-test.adyen.com",
        Dialect::PayPal => "https://api-m.sandbox.paypal.com",
        Dialect::Square => "https://connect.squareupsandbox.com",
    };
    let mut replacements = vec![
        ("listen = \"127.0.0.1:8443\"\n".to_owned(), format!("listen = \"{addr}\"\n")),
        ("listen = \"127.0.0.1:9090\"\n".to_owned(), format!("listen = \"{}\"\n", free_port())),
        (
            "token_env = \"FENCEGATE_ADMIN_TOKEN\"\n".to_owned(),
            "token = \"payments-test-admin-token-0123\"\n".to_owned(),
        ),
        ("state_dir = \"data\"\n".to_owned(), format!("state_dir = \"{}\"\n", dir.display())),
        (
            "path = \"data/fencegate.db\"\n".to_owned(),
            format!("path = \"{}\"\n", dir.join("fencegate.db").display()),
        ),
        (format!("upstream = \"{host}\"\n"), format!("upstream = \"{provider}\"\n")),
        ("timeout = \"30s\"\n".to_owned(), "timeout = \"3s\"\n".to_owned()),
        (
            "# [routes.upstream_tls]\n# ca_file = \"tls/provider-ca.crt\"\n# server_name = \"localhost\"\n".to_owned(),
            format!("[routes.upstream_tls]\nca_file = \"{}\"\nserver_name = \"localhost\"\n", ca_file.display()),
        ),
    ];
    if dialect == Dialect::PayPal {
        replacements.push((
            format!("token_url = \"{host}/v1/oauth2/token\"\n"),
            format!("token_url = \"{provider}/v1/oauth2/token\"\n"),
        ));
    }
    for (from, to) in &replacements {
        assert_eq!(
            text.matches(from.as_str()).count(),
            1,
            "{file} changed: the test expects {from:?} once"
        );
        text = text.replacen(from.as_str(), to, 1);
    }
    match idempotency {
        Idempotency::Hold => text,
        Idempotency::Resubmit => text.replacen(
            "on_unknown_outcome = \"hold\"\n",
            "on_unknown_outcome = \"resubmit\"\n",
            1,
        ),
        Idempotency::Absent => {
            let table = text
                .find("[routes.idempotency]")
                .expect("an idempotency table");
            text[..table].to_owned()
        }
    }
}

/// Three calls of every operation at once (the faults happen here; duplicates that find their
/// key in flight are refused 409 `request-in-progress`); then the application's retry, one call
/// each; then two repeats each, which find every outcome recorded. The first run's calls, and
/// the later ones'.
fn run_with_retries(bench: &Bench) -> (Vec<Call>, Vec<Call>) {
    let first = bench.run(3);
    let mut later = bench.run(1);
    later.extend(bench.run(2));
    (first, later)
}

/// A provider that ignores keys, the shipped configuration (`hold`): the duplicates and the
/// application's later retries are answered from the gateway's record or refused while the
/// dropped operation's outcome is unknown; nothing is charged twice.
fn charges_once_when_the_provider_ignores_keys(dialect: Dialect) {
    let bench = Bench::new(dialect, false, Idempotency::Hold);
    let _gateway = bench.start_gateway();
    let (first, retried) = run_with_retries(&bench);
    let counts = bench.counts();
    eprintln!("{}: charges per operation {counts:?}", dialect.name());
    assert!(
        counts.values().all(|&n| n == 1),
        "{counts:?}\n{}",
        bench.gateway_log()
    );
    let answered = ["op1", "op3", "op4"];
    bench.assert_answered_with_the_charge(&retried, &answered);
    assert!(
        first
            .iter()
            .any(|c| c.operation == LIMITED && c.line["status"] == 429),
        "the 429 reached the client"
    );
    // Held: refused 409 outcome-unknown (or, for a duplicate that comes while another call's
    // refusal holds the intent for a moment, request-in-progress), never sent again.
    let held: Vec<&Call> = retried.iter().filter(|c| c.operation == DROPPED).collect();
    for call in &held {
        assert!(
            call.problem.as_deref().is_some_and(|p| {
                p.ends_with("/outcome-unknown") || p.ends_with("/request-in-progress")
            }),
            "{DROPPED} was not held: {}",
            call.line
        );
    }
    assert!(
        held.iter().any(|c| c
            .problem
            .as_deref()
            .is_some_and(|p| p.ends_with("/outcome-unknown"))),
        "{DROPPED}: {held:?}"
    );
    bench.assert_credentials_and_keys();
    assert!(
        !bench.gateway_log().contains(SECRET),
        "the secret was logged"
    );
}

/// A provider that honours keys, `resubmit`: the dropped operation is sent again under its key
/// and answered from the provider's record; every call is answered with its one charge.
fn charges_once_when_the_provider_honours_keys(dialect: Dialect) {
    let bench = Bench::new(dialect, true, Idempotency::Resubmit);
    let _gateway = bench.start_gateway();
    let (_first, retried) = run_with_retries(&bench);
    let counts = bench.counts();
    eprintln!("{}: charges per operation {counts:?}", dialect.name());
    assert!(
        counts.values().all(|&n| n == 1),
        "{counts:?}\n{}",
        bench.gateway_log()
    );
    bench.assert_answered_with_the_charge(&retried, &OPERATIONS);
    assert!(
        bench
            .provider
            .requests()
            .iter()
            .any(|r| r["operation"] == DROPPED && r["outcome"] == "replayed"),
        "{DROPPED} was not re-sent under its key"
    );
    bench.assert_credentials_and_keys();
}

/// Without `[routes.idempotency]` each call of the library makes a key of its own: duplicates
/// are charged again even by a provider that honours keys.
fn charges_twice_without_gateway_idempotency(dialect: Dialect) {
    let bench = Bench::new(dialect, true, Idempotency::Absent);
    let _gateway = bench.start_gateway();
    let _ = bench.run(3);
    let counts = bench.counts();
    eprintln!(
        "{}, no idempotency: charges per operation {counts:?}",
        dialect.name()
    );
    assert!(counts["op1"] >= 2 && counts["op4"] >= 2, "{counts:?}");
}

#[test]
fn adyen_library_charges_each_operation_once_when_the_provider_ignores_keys() {
    charges_once_when_the_provider_ignores_keys(Dialect::Adyen);
}

#[test]
fn adyen_library_charges_each_operation_once_when_the_provider_honours_keys() {
    charges_once_when_the_provider_honours_keys(Dialect::Adyen);
}

#[test]
fn adyen_library_charges_twice_without_gateway_idempotency() {
    charges_twice_without_gateway_idempotency(Dialect::Adyen);
}

#[test]
fn paypal_library_charges_each_operation_once_when_the_provider_ignores_keys() {
    charges_once_when_the_provider_ignores_keys(Dialect::PayPal);
}

#[test]
fn paypal_library_charges_each_operation_once_when_the_provider_honours_keys() {
    charges_once_when_the_provider_honours_keys(Dialect::PayPal);
}

#[test]
fn paypal_library_charges_twice_without_gateway_idempotency() {
    charges_twice_without_gateway_idempotency(Dialect::PayPal);
}

#[test]
fn square_library_charges_each_operation_once_when_the_provider_ignores_keys() {
    charges_once_when_the_provider_ignores_keys(Dialect::Square);
}

#[test]
fn square_library_charges_each_operation_once_when_the_provider_honours_keys() {
    charges_once_when_the_provider_honours_keys(Dialect::Square);
}

#[test]
fn square_library_charges_twice_without_gateway_idempotency() {
    charges_twice_without_gateway_idempotency(Dialect::Square);
}
