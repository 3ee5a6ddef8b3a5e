//! A worker that takes a ZooKeeper lock and writes through fencegate with the lock's fencing token,
//! until it has written `--writes` times, the gateway refuses it or its session is gone
//! (docs/getting-tokens.md).
//!
//! ```text
//! cargo run --release --example zk_worker -- GATEWAY_URL [--zk HOSTS] [--lock PATH] [--every MILLIS]
//!                                  [--writes N]
//! cargo run --release --example zk_worker -- http://127.0.0.1:8080/invoices/9 --lock /locks/invoice/9
//! ```
//!
//! The lock is ZooKeeper's recipe, as in examples/tokens/zk_lock.py: create the persistent lock
//! parent if it is missing, create an ephemeral sequential node `<lock>/lock-` under it, and hold
//! the lock once that node has the lowest sequence number, watching the node just before ours
//! until then. The fencing token is our node's sequence number (`lock-0000000007`: 7). The session
//! is the lease: when it ends, ZooKeeper deletes the node. Prints `token=N`, then `status=N` per
//! write. Exits 0 after `--writes` writes (default 1) or Ctrl-C, 1 when it lost the lock (a write
//! refused, the session gone); either way it deletes its node.

use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use zookeeper_client as zk;

type Failure = Box<dyn std::error::Error + Send + Sync>;
type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The name of each contender's node; ZooKeeper appends the parent's sequence number to it.
const PREFIX: &str = "lock-";

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("zk_worker: {e}");
            ExitCode::from(2)
        }
    }
}

struct Args {
    gateway_url: String,
    zk: String,
    lock: String,
    every: Duration,
    writes: u64,
}

fn parse_args() -> Result<Args, Failure> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        gateway_url: String::new(),
        zk: "127.0.0.1:2181".to_owned(),
        lock: "/locks/invoice/42".to_owned(),
        every: Duration::from_millis(500),
        writes: 1,
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--zk" => parsed.zk = value()?,
            "--lock" => parsed.lock = value()?,
            "--every" => parsed.every = Duration::from_millis(value()?.parse()?),
            "--writes" => parsed.writes = value()?.parse()?,
            _ if parsed.gateway_url.is_empty() && !arg.starts_with("--") => {
                parsed.gateway_url = arg
            }
            _ => return Err(format!("unexpected argument {arg:?}; see the module docs").into()),
        }
    }
    if parsed.every.is_zero() {
        return Err("--every must be above zero".into());
    }
    if parsed.gateway_url.is_empty() {
        return Err(
            "usage: zk_worker GATEWAY_URL [--zk HOSTS] [--lock PATH] [--every MILLIS] [--writes N]"
                .into(),
        );
    }
    Ok(parsed)
}

async fn run() -> Result<ExitCode, Failure> {
    let args = parse_args()?;
    let zk = zk::Client::connect(&args.zk)
        .await
        .map_err(|e| format!("connecting to ZooKeeper at {}: {e}", args.zk))?;
    let anyone = zk::Acls::anyone_all();
    // Persistent: the parent keeps the sequence counter. Never delete it.
    zk.mkdir(&args.lock, &zk::CreateMode::Persistent.with_acls(anyone))
        .await?;
    let (_, sequence) = zk
        .create(
            &format!("{}/{PREFIX}", args.lock),
            &[],
            &zk::CreateMode::EphemeralSequential.with_acls(anyone),
        )
        .await?;
    // The client parsed `sequence` from the name ZooKeeper gave the node (`lock-0000000007`).
    let node = format!("{PREFIX}{sequence}");
    let outcome = hold_and_write(&zk, &args, &node, sequence).await;
    // Whatever happened, release the lock; a session that ended took the node with it.
    let path = format!("{}/{node}", args.lock);
    match zk.delete(&path, None).await {
        Ok(()) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => {}
        Err(e) => eprintln!("zk_worker: deleting {path}: {e}"),
    }
    outcome
}

async fn hold_and_write(
    zk: &zk::Client,
    args: &Args,
    node: &str,
    sequence: zk::CreateSequence,
) -> Result<ExitCode, Failure> {
    let token = u64::try_from(sequence.into_i64())
        .map_err(|_| format!("sequence number {sequence}: the parent's counter wrapped"))?;
    wait_until_lowest(zk, &args.lock, node).await?;
    println!("token={token}");
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut session = zk.state_watcher();
    let mut written = 0u64;
    let mut ticks = tokio::time::interval(args.every);
    let code = loop {
        // A worker that knows its session is gone must not write again. (While it is only
        // disconnected the session may live on, or may have ended unseen: the gateway fences that.)
        let state = zk.state();
        if state.is_terminated() {
            eprintln!("zk_worker: session {state:?}: the lock is gone; stopping");
            break ExitCode::FAILURE;
        }
        if written >= args.writes {
            break ExitCode::SUCCESS;
        }
        tokio::select! {
            biased;
            _ = session.changed() => continue,
            _ = tokio::signal::ctrl_c() => break ExitCode::SUCCESS,
            _ = ticks.tick() => {}
        }
        let body = format!("write {written} under token {token}");
        let (status, answer) = fenced_put(&client, &args.gateway_url, token, body).await?;
        println!("status={}", status.as_u16());
        written += 1;
        if status.is_client_error() {
            // 409 stale-fence: a newer holder exists. Never retry with this token.
            eprintln!("zk_worker: refused, stopping: {answer}");
            break ExitCode::FAILURE;
        }
        if !status.is_success() {
            eprintln!("zk_worker: not written ({status}), trying again: {answer}");
        }
    };
    Ok(code)
}

/// Waits until our node `node` has the lowest sequence number under `parent`, watching the node
/// just before ours (not the parent's children, so a release wakes one contender only).
async fn wait_until_lowest(zk: &zk::Client, parent: &str, node: &str) -> Result<(), Failure> {
    loop {
        let mut children = zk.list_children(parent).await?;
        children.retain(|child| child.starts_with(PREFIX));
        children.sort(); // ten digits, zero-padded: by name is by sequence number
        let index = children
            .iter()
            .position(|child| child == node)
            .ok_or_else(|| format!("our node {parent}/{node} is gone"))?;
        if index == 0 {
            return Ok(());
        }
        let before = format!("{parent}/{}", children[index - 1]);
        let (stat, gone) = zk.check_and_watch_stat(&before).await?;
        if stat.is_some() {
            gone.changed().await;
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
