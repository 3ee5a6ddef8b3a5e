//! A worker that takes an etcd lock and writes through fencegate with the lock's fencing token,
//! keeping its lease alive, until the gateway refuses it or the lease is gone
//! (docs/getting-tokens.md).
//!
//! ```text
//! cargo run --release --example etcd_worker -- GATEWAY_URL [--etcd URL] [--lock NAME] [--ttl SECONDS]
//!                                    [--every MILLIS] [--writes N]
//! cargo run --release --example etcd_worker -- http://127.0.0.1:8080/invoices/42 --writes 5
//! ```
//!
//! The lock is etcd's own recipe (Go's `concurrency.Mutex`, `etcdctl lock`) over the v3 HTTP/JSON
//! gateway every etcd member serves: grant a lease, put `<lock>/<lease id in hex>` attached to it,
//! hold the lock once that key has the lowest create revision under `<lock>/`; the fencing token is
//! that create revision. Prints `token=N`, then `status=N` per write. Exits 0 after `--writes`
//! writes or Ctrl-C, 1 when it lost the lock (a write refused, the lease gone); either way it
//! revokes its lease.

use std::process::ExitCode;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

type Failure = Box<dyn std::error::Error + Send + Sync>;
type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How often a waiting contender looks at the lock again (a watch would wake it instead; polling
/// keeps the example short).
const LOCK_POLL: Duration = Duration::from_millis(100);

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("etcd_worker: {e}");
            ExitCode::from(2)
        }
    }
}

struct Args {
    gateway_url: String,
    etcd: String,
    lock: String,
    ttl_secs: u64,
    every: Duration,
    writes: Option<u64>,
}

fn parse_args() -> Result<Args, Failure> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        gateway_url: String::new(),
        etcd: "http://127.0.0.1:2379".to_owned(),
        lock: "locks/invoice/42".to_owned(),
        ttl_secs: 5,
        every: Duration::from_millis(500),
        writes: None,
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--etcd" => parsed.etcd = value()?,
            "--lock" => parsed.lock = value()?,
            "--ttl" => parsed.ttl_secs = value()?.parse()?,
            "--every" => parsed.every = Duration::from_millis(value()?.parse()?),
            "--writes" => parsed.writes = Some(value()?.parse()?),
            _ if parsed.gateway_url.is_empty() && !arg.starts_with("--") => {
                parsed.gateway_url = arg
            }
            _ => return Err(format!("unexpected argument {arg:?}; see the module docs").into()),
        }
    }
    if parsed.ttl_secs == 0 || parsed.every.is_zero() {
        return Err("--ttl and --every must be above zero".into());
    }
    if parsed.gateway_url.is_empty() {
        return Err(
            "usage: etcd_worker GATEWAY_URL [--etcd URL] [--lock NAME] [--ttl SECONDS] \
                    [--every MILLIS] [--writes N]"
                .into(),
        );
    }
    Ok(parsed)
}

async fn run() -> Result<ExitCode, Failure> {
    let args = parse_args()?;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let etcd = Etcd {
        client: client.clone(),
        base: args.etcd.trim_end_matches('/').to_owned(),
    };
    let lease = etcd.grant(args.ttl_secs).await?;
    let outcome = hold_and_write(&etcd, &client, &args, &lease).await;
    // Whatever happened, release the lock.
    if let Err(e) = etcd.revoke(&lease).await {
        eprintln!("etcd_worker: revoking lease {lease}: {e}");
    }
    outcome
}

async fn hold_and_write(
    etcd: &Etcd,
    client: &HttpClient,
    args: &Args,
    lease: &str,
) -> Result<ExitCode, Failure> {
    let token = etcd.lock(&args.lock, lease).await?;
    println!("token={token}");
    // Keep the lease alive at a third of its TTL; the task ends when etcd says it is gone.
    let mut lease_lost = tokio::spawn(keep_alive(
        etcd.clone(),
        lease.to_owned(),
        Duration::from_secs(args.ttl_secs) / 3,
    ));
    let mut written = 0u64;
    let mut ticks = tokio::time::interval(args.every);
    let code = loop {
        if args.writes.is_some_and(|n| written >= n) {
            break ExitCode::SUCCESS;
        }
        tokio::select! {
            // A worker that knows its lease is gone must not write again.
            biased;
            ended = &mut lease_lost => {
                eprintln!("etcd_worker: lease {lease} is gone ({ended:?}); stopping");
                break ExitCode::FAILURE;
            }
            _ = tokio::signal::ctrl_c() => break ExitCode::SUCCESS,
            _ = ticks.tick() => {}
        }
        let body = format!("write {written} under token {token}");
        let (status, answer) = fenced_put(client, &args.gateway_url, token, body).await?;
        println!("status={}", status.as_u16());
        written += 1;
        if status.is_client_error() {
            // 409 stale-fence (or lease-ended): a newer holder exists. Never retry with this token.
            eprintln!("etcd_worker: refused, stopping: {answer}");
            break ExitCode::FAILURE;
        }
        if !status.is_success() {
            eprintln!("etcd_worker: not written ({status}), trying again: {answer}");
        }
    };
    lease_lost.abort();
    Ok(code)
}

/// Renews `lease` every `every` until etcd no longer knows it (expired or revoked).
async fn keep_alive(etcd: Etcd, lease: String, every: Duration) -> Result<(), String> {
    let mut ticks = tokio::time::interval(every);
    loop {
        ticks.tick().await;
        match etcd.keep_alive(&lease).await {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// A `PUT` through the gateway with `X-Fence: token`: the status and the body of the answer.
async fn fenced_put(
    client: &HttpClient,
    url: &str,
    token: u64,
    body: String,
) -> Result<(http::StatusCode, String), Failure> {
    let request = http::Request::put(url)
        .header("x-fence", token.to_string())
        .body(Full::new(Bytes::from(body)))?;
    let response = client.request(request).await?;
    let status = response.status();
    let answer = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&answer).into_owned()))
}

/// etcd's v3 HTTP/JSON gateway: keys and values base64, int64 fields as strings.
#[derive(Clone)]
struct Etcd {
    client: HttpClient,
    base: String,
}

impl Etcd {
    async fn call(&self, path: &str, body: Value) -> Result<Value, Failure> {
        let request = http::Request::post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))?;
        let response = self.client.request(request).await?;
        let status = response.status();
        let answer = response.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            let body = String::from_utf8_lossy(&answer).into_owned();
            return Err(Box::new(EtcdRefused {
                path: path.to_owned(),
                status,
                body,
            }));
        }
        Ok(serde_json::from_slice(&answer)?)
    }

    /// A new lease of `ttl_secs` seconds: its id.
    async fn grant(&self, ttl_secs: u64) -> Result<String, Failure> {
        let answer = self
            .call("/v3/lease/grant", json!({"TTL": ttl_secs.to_string()}))
            .await?;
        Ok(text(&answer["ID"])?.to_owned())
    }

    /// Waits until `lease` holds the lock `name`; the fencing token.
    async fn lock(&self, name: &str, lease: &str) -> Result<u64, Failure> {
        let lease_hex = format!("{:x}", lease.parse::<i64>()?);
        let key = b64(format!("{name}/{lease_hex}").as_bytes());
        // Our key, unless it exists already (a retry); either way, learn its create revision.
        let txn = self
            .call(
                "/v3/kv/txn",
                json!({
                    "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                    "success": [{"request_put": {"key": key, "value": "", "lease": lease}}],
                    "failure": [{"request_range": {"key": key}}],
                }),
            )
            .await?;
        let revision = if txn["succeeded"].as_bool() == Some(true) {
            &txn["header"]["revision"]
        } else {
            &txn["responses"][0]["response_range"]["kvs"][0]["create_revision"]
        };
        let token = text(revision)?.parse()?;
        // The holder is the contender created first: wait until that is us.
        let prefix = format!("{name}/");
        loop {
            let first = self
                .call(
                    "/v3/kv/range",
                    json!({
                        "key": b64(prefix.as_bytes()),
                        "range_end": b64(&prefix_end(&prefix)),
                        "sort_order": "ASCEND",
                        "sort_target": "CREATE",
                        "limit": "1",
                    }),
                )
                .await?;
            if first["kvs"][0]["key"].as_str() == Some(key.as_str()) {
                return Ok(token);
            }
            tokio::time::sleep(LOCK_POLL).await;
        }
    }

    /// Renews `lease`: false when etcd no longer has it.
    async fn keep_alive(&self, lease: &str) -> Result<bool, Failure> {
        let answer = self
            .call("/v3/lease/keepalive", json!({"ID": lease}))
            .await?;
        // A lease that is gone answers without a TTL (zero is left out of the JSON).
        Ok(answer["result"]["TTL"]
            .as_str()
            .is_some_and(|ttl| ttl != "0"))
    }

    /// Ends `lease`, deleting our key: the next contender holds the lock at once.
    async fn revoke(&self, lease: &str) -> Result<(), Failure> {
        match self.call("/v3/lease/revoke", json!({"ID": lease})).await {
            Ok(_) => Ok(()),
            // Expired already (the worker was paused): nothing is left to release.
            Err(e)
                if e.downcast_ref::<EtcdRefused>()
                    .is_some_and(|r| r.status == 404) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// etcd answered a call with an error status.
#[derive(Debug)]
struct EtcdRefused {
    path: String,
    status: http::StatusCode,
    body: String,
}

impl std::fmt::Display for EtcdRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "etcd {} answered {}: {}",
            self.path, self.status, self.body
        )
    }
}

impl std::error::Error for EtcdRefused {}

fn text(value: &Value) -> Result<&str, Failure> {
    value
        .as_str()
        .ok_or_else(|| format!("etcd answered {value} where a string was expected").into())
}

fn b64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// The end of the key range under `prefix`: its last byte plus one (a prefix ending in `/`).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}
