//! A real client end to end: the official Stripe Python library (`stripe`, its own automatic
//! retries on) through the real binary over TLS to a fake provider over TLS, configured by the
//! shipped `config/stripe.toml`. Across the library's retries, duplicate calls, connections the
//! provider drops after charging, and a gateway killed with `kill -9` mid-call and restarted,
//! each payout is charged once: when the provider honours the key, and when it ignores the key on
//! a route that holds unknown outcomes until an operator resolves them. The same runs without
//! those settings charge twice, which shows the check can fail.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::process::{binary, free_port};
use crate::support::stripe::{
    require_stripe_library, CallResult, ClientRun, FakeProvider, ProviderBehaviour,
};
use crate::support::tls::{write, TestCa};
use crate::support::GatewayProcess;

/// The secret only the gateway holds (`STRIPE_SECRET_KEY`); the provider serves nothing else.
const GATEWAY_SECRET: &str = "sk_test_gateway_only_4242";
/// What the client library is configured with; the gateway replaces it.
const CLIENT_KEY: &str = "sk_test_client_placeholder";
/// The route's timeout in the tests (the shipped 30 s would make a dead attempt's lease 35 s).
const ROUTE_TIMEOUT: &str = "2s";
/// Retries enough to outlast a dead attempt's lease (route timeout + 5 s): the library's backoff
/// sleeps at least 0.5, 0.5, 1, 2, 2.5, 2.5, ... seconds.
const PATIENT_RETRIES: usize = 10;
/// The library's default-like retries, for runs whose held calls are expected to give up.
const FEW_RETRIES: usize = 3;
/// How long the provider takes to answer the payout that is in flight when the gateway dies.
const SLOW_ANSWER_SECS: f64 = 1.5;

const PAYOUTS: [&str; 6] = ["po_1", "po_2", "po_3", "po_4", "po_5", "po_6"];
/// Charged, then the connection reset without an answer (first time only).
const DROPPED: [&str; 2] = ["po_2", "po_5"];
/// Answered 500 without a charge (first time only).
const FAILED: &str = "po_3";
/// Charged, then answered slowly; the gateway is killed meanwhile.
const IN_FLIGHT: &str = "po_6";

/// What `[routes.idempotency]` the route gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Idempotency {
    /// As shipped: `on_unknown_outcome = "hold"`.
    Hold,
    /// `on_unknown_outcome = "resubmit"`.
    Resubmit,
    /// No `[routes.idempotency]` table.
    Absent,
}

/// The provider, the CA, and the gateway's configuration file, in one temporary directory.
struct Bench {
    dir: tempfile::TempDir,
    ca_file: PathBuf,
    config: PathBuf,
    addr: SocketAddr,
    provider: FakeProvider,
}

impl Bench {
    fn new(behaviour: ProviderBehaviour, idempotency: Idempotency) -> Bench {
        require_stripe_library();
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("stripe end-to-end CA");
        let ca_file = write(dir.path(), "ca.crt", &ca.pem);
        let names = ["localhost", "127.0.0.1"];
        let (gateway_cert, gateway_key) = ca.leaf(&names).write(dir.path(), "gateway");
        let (provider_cert, provider_key) = ca.leaf(&names).write(dir.path(), "provider");
        let provider = FakeProvider::start(
            dir.path(),
            &provider_cert,
            &provider_key,
            GATEWAY_SECRET,
            &behaviour,
        );
        let addr = free_port();
        let text = shipped_config_for_test(&ShippedConfigPaths {
            dir: dir.path(),
            addr,
            admin: free_port(),
            gateway_cert: &gateway_cert,
            gateway_key: &gateway_key,
            ca_file: &ca_file,
            provider: &provider.url(),
            idempotency,
        });
        let config = write(dir.path(), "fencegate.toml", &text);
        Bench {
            dir,
            ca_file,
            config,
            addr,
            provider,
        }
    }

    /// `fencegate serve` on this bench's file and address (the same one after a restart).
    fn start_gateway(&self) -> GatewayProcess {
        GatewayProcess::serve_file(
            &self.config,
            self.addr,
            &[("STRIPE_SECRET_KEY", GATEWAY_SECRET)],
        )
    }

    fn client(&self, payouts: &[&str], duplicates: usize, retries: usize) -> ClientRun {
        ClientRun {
            base: format!("https://localhost:{}", self.addr.port()),
            ca_file: self.ca_file.clone(),
            api_key: CLIENT_KEY.to_owned(),
            payouts: payouts.iter().map(|p| (*p).to_owned()).collect(),
            duplicates,
            retries,
        }
    }

    /// `fencegate intents ARGS --config FILE`, as an operator runs it; its stdout.
    fn intents(&self, args: &[&str]) -> String {
        let output = Command::new(binary())
            .arg("intents")
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env("STRIPE_SECRET_KEY", GATEWAY_SECRET)
            .output()
            .expect("run fencegate intents");
        assert!(
            output.status.success(),
            "fencegate intents {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8 output")
    }

    /// Waits until the provider has charged `payout`.
    fn wait_for_charge(&self, payout: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.provider.charges().iter().any(|c| c.payout == payout) {
            assert!(
                Instant::now() < deadline,
                "{payout} was never charged; the gateway's log: {}",
                self.gateway_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn gateway_log(&self) -> String {
        std::fs::read_to_string(crate::support::process::stderr_path(self.dir.path()))
            .unwrap_or_default()
    }

    /// The provider saw only the gateway's secret, never the client's key.
    fn assert_only_the_gateway_secret_reached_the_provider(&self) {
        let requests = self.provider.requests();
        assert!(!requests.is_empty());
        let expected = format!("Bearer {GATEWAY_SECRET}");
        for request in &requests {
            assert_eq!(
                request["authorization"].as_str(),
                Some(expected.as_str()),
                "the provider saw another credential: {request}"
            );
        }
        assert!(
            !requests.iter().any(|r| r.to_string().contains(CLIENT_KEY)),
            "the client's key reached the provider"
        );
    }

    /// Each payout reached the provider under one idempotency key, a UUID, its own.
    fn assert_one_key_per_payout(&self) {
        let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for request in self.provider.requests() {
            let payout = request["payout"].as_str().unwrap_or_default().to_owned();
            let key = request["idempotency_key"].as_str().unwrap_or_default();
            keys.entry(payout).or_default().insert(key.to_owned());
        }
        let mut all = BTreeSet::new();
        for (payout, seen) in &keys {
            assert_eq!(
                seen.len(),
                1,
                "{payout} reached the provider under {seen:?}"
            );
            let key = seen.iter().next().unwrap();
            assert!(
                uuid::Uuid::parse_str(key).is_ok() && key.len() == 36,
                "{payout}: {key:?} is not a UUID"
            );
            assert!(all.insert(key.clone()), "{payout} shares its key {key}");
        }
    }

    /// What the provider did with each payout's requests, e.g. `po_2: charged-then-dropped`.
    fn provider_outcomes(&self, payout: &str) -> Vec<String> {
        self.provider
            .requests()
            .iter()
            .filter(|r| r["payout"].as_str() == Some(payout))
            .map(|r| r["outcome"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

/// Where the test's files are, for [`shipped_config_for_test`].
struct ShippedConfigPaths<'a> {
    dir: &'a Path,
    addr: SocketAddr,
    /// The admin listener's address (the shipped 127.0.0.1:9090 may be taken here).
    admin: SocketAddr,
    gateway_cert: &'a Path,
    gateway_key: &'a Path,
    ca_file: &'a Path,
    provider: &'a str,
    idempotency: Idempotency,
}

/// `config/stripe.toml` as shipped, with only what a test must change: its addresses and
/// directories, the admin token inline instead of from `FENCEGATE_ADMIN_TOKEN`, TLS on the
/// listener, the fake provider and its CA instead of api.stripe.com, a shorter route timeout, and
/// the idempotency variant.
fn shipped_config_for_test(paths: &ShippedConfigPaths<'_>) -> String {
    let shipped = format!("{}/config/stripe.toml", env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(&shipped).expect("read config/stripe.toml");
    let replacements = [
        (
            "listen = \"127.0.0.1:8443\"\n".to_owned(),
            format!("listen = \"{}\"\n", paths.addr),
        ),
        (
            "listen = \"127.0.0.1:9090\"\n".to_owned(),
            format!("listen = \"{}\"\n", paths.admin),
        ),
        (
            "token_env = \"FENCEGATE_ADMIN_TOKEN\"\n".to_owned(),
            "token = \"stripe-test-admin-token-0123456789\"\n".to_owned(),
        ),
        (
            "state_dir = \"data\"\n".to_owned(),
            format!("state_dir = \"{}\"\n", paths.dir.display()),
        ),
        (
            "# [server.tls]\n# cert = \"tls/server.crt\"\n# key = \"tls/server.key\"\n".to_owned(),
            format!(
                "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
                paths.gateway_cert.display(),
                paths.gateway_key.display()
            ),
        ),
        (
            "path = \"data/fencegate.db\"\n".to_owned(),
            format!("path = \"{}\"\n", paths.dir.join("fencegate.db").display()),
        ),
        (
            "upstream = \"https://api.stripe.com\"\n".to_owned(),
            format!("upstream = \"{}\"\n", paths.provider),
        ),
        (
            "timeout = \"30s\"\n".to_owned(),
            format!("timeout = \"{ROUTE_TIMEOUT}\"\n"),
        ),
        (
            "# [routes.upstream_tls]\n# ca_file = \"tls/provider-ca.crt\"\n# server_name = \"localhost\"\n"
                .to_owned(),
            format!(
                "[routes.upstream_tls]\nca_file = \"{}\"\nserver_name = \"localhost\"\n",
                paths.ca_file.display()
            ),
        ),
    ];
    for (from, to) in &replacements {
        text = replace_once(&text, from, to);
    }
    match paths.idempotency {
        Idempotency::Hold => text,
        Idempotency::Resubmit => replace_once(
            &text,
            "on_unknown_outcome = \"hold\"\n",
            "on_unknown_outcome = \"resubmit\"\n",
        ),
        Idempotency::Absent => {
            let table = text
                .find("[routes.idempotency]")
                .expect("config/stripe.toml has [routes.idempotency]");
            text[..table].to_owned()
        }
    }
}

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "config/stripe.toml changed: the test expects {from:?} once"
    );
    text.replacen(from, to, 1)
}

/// The behaviour every scenario's provider has besides honouring or ignoring keys.
fn faulty_provider(honour_keys: bool) -> ProviderBehaviour {
    ProviderBehaviour {
        honour_keys,
        drop_after_charge: DROPPED.iter().map(|p| (*p).to_owned()).collect(),
        fail_before_charge: vec![FAILED.to_owned()],
        slow: vec![(IN_FLIGHT.to_owned(), SLOW_ANSWER_SECS)],
    }
}

/// Charges `PAYOUTS` through `gateway`: first all but `IN_FLIGHT`, to the end of the library's
/// retries; then `IN_FLIGHT`, killing the gateway with `kill -9` while the provider is still
/// answering its charge and restarting it on the same address. The calls' results and the
/// restarted gateway.
fn run_with_a_kill_in_flight(
    bench: &Bench,
    gateway: GatewayProcess,
    duplicates: usize,
    retries: usize,
) -> (Vec<CallResult>, GatewayProcess) {
    let others: Vec<&str> = PAYOUTS.into_iter().filter(|p| *p != IN_FLIGHT).collect();
    let mut results = bench.client(&others, duplicates, retries).run();
    let running = bench.client(&[IN_FLIGHT], duplicates, retries).spawn();
    bench.wait_for_charge(IN_FLIGHT);
    gateway.kill_9();
    let restarted = bench.start_gateway();
    results.extend(running.finish());
    (results, restarted)
}

/// The provider's charge counts for every payout of `PAYOUTS` (0 for the ones never charged).
fn counts(bench: &Bench) -> BTreeMap<String, usize> {
    let mut counts = bench.provider.charges_per_payout();
    for payout in PAYOUTS {
        counts.entry(payout.to_owned()).or_insert(0);
    }
    counts
}

/// Every call was answered with a charge, and every call of one payout with the one charge the
/// provider made for it.
fn assert_every_call_got_the_payouts_charge(bench: &Bench, results: &[CallResult]) {
    let charges = bench.provider.charges();
    for result in results {
        assert!(
            result.ok,
            "a call was not answered with a charge: {}",
            result.line
        );
        let made: Vec<_> = charges
            .iter()
            .filter(|c| c.payout == result.payout)
            .collect();
        assert_eq!(made.len(), 1, "{}: charges {made:?}", result.payout);
        assert_eq!(
            result.charge.as_deref(),
            Some(made[0].charge.as_str()),
            "{}",
            result.line
        );
    }
}

fn print_results(scenario: &str, results: &[CallResult], bench: &Bench) {
    for result in results {
        eprintln!("{scenario}: {}", result.line);
    }
    eprintln!("{scenario}: charges per payout {:?}", counts(bench));
}

#[test]
fn stripe_library_charges_each_payout_once_when_the_provider_honours_keys() {
    // The default for unknown outcomes: re-sent with the same key, which this provider honours.
    let bench = Bench::new(faulty_provider(true), Idempotency::Resubmit);
    let gateway = bench.start_gateway();
    // Three calls per payout at once; drops after charging, a 500 before it, and the gateway
    // killed while a charge is in flight.
    let (first, gateway) = run_with_a_kill_in_flight(&bench, gateway, 3, PATIENT_RETRIES);
    print_results("honoured, first run", &first, &bench);
    assert_every_call_got_the_payouts_charge(&bench, &first);
    assert!(
        first
            .iter()
            .any(|r| r.payout == IN_FLIGHT && r.attempts.iter().any(|a| a == "connection-error")),
        "the kill did not reach a call in flight: {:?}",
        first.iter().map(|r| &r.line).collect::<Vec<_>>()
    );

    // Killed again between two runs; the repeats are replayed by the gateway.
    gateway.kill_9();
    let _gateway = bench.start_gateway();
    let provider_calls = bench.provider.requests().len();
    let second = bench.client(&PAYOUTS, 2, PATIENT_RETRIES).run();
    print_results("honoured, second run", &second, &bench);
    assert_every_call_got_the_payouts_charge(&bench, &second);
    assert_eq!(
        bench.provider.requests().len(),
        provider_calls,
        "the repeats were answered from the gateway's record"
    );

    assert!(
        counts(&bench).values().all(|&n| n == 1),
        "{:?}",
        counts(&bench)
    );
    for payout in DROPPED {
        let outcomes = bench.provider_outcomes(payout);
        assert!(
            outcomes.contains(&"charged-then-dropped".to_owned())
                && outcomes.contains(&"replayed".to_owned()),
            "{payout}: {outcomes:?}"
        );
    }
    assert!(bench
        .provider_outcomes(FAILED)
        .contains(&"failed-before-charge".to_owned()));
    assert!(bench
        .provider_outcomes(IN_FLIGHT)
        .contains(&"charged-then-slow".to_owned()));
    bench.assert_only_the_gateway_secret_reached_the_provider();
    bench.assert_one_key_per_payout();
}

#[test]
fn stripe_library_charges_each_payout_once_when_the_provider_ignores_keys_and_the_route_holds() {
    let bench = Bench::new(faulty_provider(false), Idempotency::Hold);
    let gateway = bench.start_gateway();
    let (first, gateway) = run_with_a_kill_in_flight(&bench, gateway, 3, FEW_RETRIES);
    print_results("ignored + hold, first run", &first, &bench);
    let during = counts(&bench);
    assert!(
        during.values().all(|&n| n <= 1),
        "a payout was charged twice: {during:?}"
    );
    // The payouts that went well were answered; the held ones (outcome unknown) and the one in
    // flight when the gateway died (its attempt's lease outlasts these few retries) were refused.
    assert_every_call_got_the_payouts_charge(
        &bench,
        &first
            .iter()
            .filter(|r| r.payout == "po_1" || r.payout == "po_4")
            .cloned()
            .collect::<Vec<_>>(),
    );
    assert!(
        first
            .iter()
            .filter(|r| r.payout == IN_FLIGHT)
            .all(|r| !r.ok),
        "{IN_FLIGHT} was answered while its outcome was unknown"
    );
    for payout in DROPPED.iter().chain([&FAILED]) {
        assert!(
            first.iter().any(|r| r.payout == *payout
                && r.problem
                    .as_deref()
                    .is_some_and(|p| p.ends_with("outcome-unknown"))),
            "{payout} was not held: {:?}",
            first
                .iter()
                .filter(|r| r.payout == *payout)
                .map(|r| &r.line)
                .collect::<Vec<_>>()
        );
    }

    // Reconciliation, as an operator does it: the gateway stopped, the held intents listed, each
    // looked up in the provider's record by the idempotency key the provider saw.
    assert!(gateway.terminate().success());
    let listed: Vec<serde_json::Value> = bench
        .intents(&["list", "--older-than", "0s"])
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let payout_of_key: BTreeMap<String, String> = bench
        .provider
        .requests()
        .iter()
        .map(|r| {
            (
                r["idempotency_key"].as_str().unwrap_or_default().to_owned(),
                r["payout"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let charges = bench.provider.charges();
    let (mut recorded, mut released) = (BTreeSet::new(), BTreeSet::new());
    for intent in &listed {
        let key = intent["key"].as_str().expect("an intent key");
        let sent = key.strip_prefix("stripe/").expect("the route's name first");
        let payout = payout_of_key
            .get(sent)
            .unwrap_or_else(|| panic!("the provider never saw {key}"))
            .clone();
        match charges
            .iter()
            .find(|c| c.idempotency_key.as_deref() == Some(sent))
        {
            Some(charge) => {
                let body = charge.response.to_string();
                bench.intents(&[
                    "resolve",
                    key,
                    "--status",
                    "200",
                    "--body",
                    &body,
                    "--header",
                    "content-type: application/json",
                ]);
                recorded.insert(payout);
            }
            None => {
                bench.intents(&["resolve", key, "--release"]);
                released.insert(payout);
            }
        }
    }
    eprintln!("ignored + hold: operator recorded {recorded:?}, released {released:?}");
    // Charged without an answer: the dropped ones and the one in flight. Not charged: the 500.
    let mut held = BTreeSet::from(DROPPED.map(str::to_owned));
    held.insert(IN_FLIGHT.to_owned());
    assert_eq!(recorded, held, "listed: {listed:?}");
    assert_eq!(released, BTreeSet::from([FAILED.to_owned()]));
    assert_eq!(bench.intents(&["list", "--older-than", "0s"]), "");

    // Restarted, the same calls again: every payout answered, each charged once.
    let _gateway = bench.start_gateway();
    let second = bench.client(&PAYOUTS, 3, FEW_RETRIES).run();
    print_results("ignored + hold, after reconciliation", &second, &bench);
    assert_every_call_got_the_payouts_charge(&bench, &second);
    assert!(
        counts(&bench).values().all(|&n| n == 1),
        "{:?}",
        counts(&bench)
    );
    bench.assert_only_the_gateway_secret_reached_the_provider();
    bench.assert_one_key_per_payout();
}

#[test]
fn stripe_library_charges_twice_when_the_provider_ignores_keys_and_the_route_resubmits() {
    let bench = Bench::new(faulty_provider(false), Idempotency::Resubmit);
    let _gateway = bench.start_gateway();
    let results = bench.client(&PAYOUTS[..3], 2, FEW_RETRIES).run();
    print_results("ignored + resubmit", &results, &bench);
    let counts = counts(&bench);
    assert!(
        counts["po_2"] >= 2,
        "the dropped charge was re-sent and charged again: {counts:?}"
    );
}

#[test]
fn stripe_library_charges_every_duplicate_without_gateway_idempotency() {
    // Even a provider that honours keys charges every duplicate: each call of the library makes
    // a key of its own.
    let bench = Bench::new(faulty_provider(true), Idempotency::Absent);
    let _gateway = bench.start_gateway();
    let results = bench.client(&PAYOUTS[..3], 3, FEW_RETRIES).run();
    print_results("no idempotency", &results, &bench);
    let counts = counts(&bench);
    for payout in &PAYOUTS[..3] {
        assert!(counts[*payout] >= 2, "{payout}: {counts:?}");
    }
}
