//! The admin API against its OpenAPI document, docs/admin-openapi.json: the running listener
//! serves the document exactly as checked in, and schemathesis (PyPI, pinned and installed by
//! tests/tools/install-schemathesis.sh) sends it generated requests — valid and invalid, with and
//! without the bearer token, with methods the document does not list — and checks every answer
//! against the document: no 5xx, only documented status codes, content types, headers and bodies,
//! valid input accepted and invalid input refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::gateway::fenced_route;
use crate::support::process::Launch;
use crate::support::{send, Behavior, GatewayProcess, RecordingUpstream, DELAY_HEADER};

const TOKEN: &str = "openapi-test-token-0123456789";

/// Generated test cases per operation and phase: enough to reach what these small endpoints answer
/// with a healthy store (about 600 requests), few enough that the run takes some 10 s on two cores.
/// Each run draws a new seed, printed at the end of schemathesis's output.
const MAX_EXAMPLES: &str = "30";

/// Everything schemathesis 4 checks, less `object_level_authorization`: the admin API has one
/// token and no per-object owners.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
response_headers_conformance,response_schema_conformance,negative_data_rejection,\
positive_data_acceptance,missing_required_header,unsupported_method,allow_header_conformance,\
use_after_free,ensure_resource_availability,ignored_auth";

/// How long the gateway may take to say it is healthy.
const HEALTHZ_TIMEOUT: Duration = Duration::from_secs(10);

fn openapi_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/admin-openapi.json")
}

/// A fenced route (`invoices`, keys `invoice:{id}`) and an idempotent one (`payouts`, raw keys
/// `payout:{id}`) whose 300 ms timeout leaves a slower call's outcome unknown.
fn routes(upstream: &str) -> String {
    let fenced = fenced_route("invoices", upstream, "enforce", "monotonic").replace(
        "resource_key = \"invoices:{id}\"",
        "resource_key = \"invoice:{id}\"",
    );
    assert!(
        fenced.contains("\"invoice:{id}\""),
        "the route template changed: {fenced}"
    );
    format!(
        "{fenced}[[routes]]\nname = \"payouts\"\npath = \"/payouts/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"payout:{{id}}\"\ntimeout = \"300ms\"\n\n[routes.idempotency]\nkey = \"payout:{{id}}\"\n"
    )
}

async fn wait_until_healthy(gateway: &GatewayProcess) {
    let deadline = Instant::now() + HEALTHZ_TIMEOUT;
    loop {
        if send("GET", &gateway.admin_url("/healthz"), &[], "")
            .await
            .status
            == 200
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz did not answer 200 within {HEALTHZ_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The mark and the intent the document's examples name (`invoice:72`, `payouts/payout:7`), so
/// that generated requests reach the 200 answers, not only the 404s.
async fn seed_examples(gateway: &GatewayProcess, auth: &str) {
    let written = send(
        "PUT",
        &gateway.url("/invoices/72"),
        &[("x-fence", "33")],
        "",
    )
    .await;
    assert_eq!(written.status, 200, "{:?}", written.body);
    let unknown = send(
        "POST",
        &gateway.url("/payouts/7"),
        &[("x-fence", "1"), (DELAY_HEADER, "2000")],
        "{\"amount\":100}",
    )
    .await;
    assert_eq!(unknown.status, 504, "{:?}", unknown.body);
    let listed = send(
        "GET",
        &gateway.admin_url("/admin/intents?state=submitting"),
        &[("authorization", auth)],
        "",
    )
    .await;
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    assert_eq!(
        listed.json()["intents"][0]["key"],
        "payouts/payout:7",
        "{:?}",
        listed.body
    );
}

/// Runs tests/tools/install-schemathesis.sh (a no-op once installed) and returns the
/// executable's path.
fn install_schemathesis() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/install-schemathesis.sh");
    let output = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("{} could not be run: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} failed ({}): {stderr}",
        script.display(),
        output.status
    );
    eprintln!("{}", stderr.trim_end());
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// `schemathesis run` of the document against the admin listener at `base_url`, run in `dir`
/// (schemathesis reads a `schemathesis.toml` from where it runs: there is none there).
fn schemathesis_command(schemathesis: &Path, base_url: &str, dir: &Path) -> Command {
    let mut command = Command::new(schemathesis);
    command
        .arg("run")
        .arg(openapi_path())
        .args(["--url", base_url])
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .args(["--checks", CHECKS])
        .args(["--max-examples", MAX_EXAMPLES])
        .args(["--request-timeout", "10"])
        .args(["--generation-database", "none"])
        .arg("--no-color")
        .current_dir(dir)
        .env("NO_PROXY", "127.0.0.1,localhost");
    command
}

fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_answers_as_its_openapi_document_says() {
    let schemathesis = tokio::task::spawn_blocking(install_schemathesis)
        .await
        .expect("the installer's thread");
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let gateway = Launch::new()
        .admin(TOKEN, "")
        .start(dir.path(), &routes(&upstream.url()));
    wait_until_healthy(&gateway).await;
    let auth = format!("Bearer {TOKEN}");
    seed_examples(&gateway, &auth).await;

    let served = send(
        "GET",
        &gateway.admin_url("/admin/openapi.json"),
        &[("authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(served.status, 200, "{:?}", served.body);
    assert_eq!(served.header("content-type"), Some("application/json"));
    let file = std::fs::read_to_string(openapi_path()).expect("read docs/admin-openapi.json");
    let file: serde_json::Value =
        serde_json::from_str(&file).expect("docs/admin-openapi.json is JSON");
    assert_eq!(
        served.json(),
        file,
        "/admin/openapi.json is not docs/admin-openapi.json"
    );

    let mut command = schemathesis_command(&schemathesis, &gateway.admin_url(""), dir.path());
    eprintln!("running {command:?}");
    let started = Instant::now();
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("schemathesis's thread")
        .expect("run schemathesis");
    eprintln!("schemathesis ran for {:?}", started.elapsed());
    assert!(
        output.status.success(),
        "schemathesis found answers the document does not allow ({}):\n{}\n\
         gateway log:\n{}",
        output.status,
        printed(&output),
        std::fs::read_to_string(crate::support::process::stderr_path(dir.path()))
            .unwrap_or_default()
    );
    eprintln!("{}", printed(&output));
}
