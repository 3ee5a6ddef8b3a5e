//! Issue 17, item 4: after a store blip the first write succeeds. One gateway process reaches
//! PostgreSQL or Redis through a relay; four clients each write every 10 ms, through a 50 ms cut
//! or pausing over it; per backend and ordering it prints the 503s before and after the restore
//! and asserts that each client's first write after the restore succeeds, that no write sent
//! later than 100 ms after it gets a 503, and that only 2xx were forwarded.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::gateway::fenced_route;
use support::network_store::{with_namespace, Backend};
use support::relay::{Relay, RelayMode};
use support::{send, Behavior, GatewayProcess, RecordingUpstream};

/// Concurrent clients, each on its own keys, each sending one write at a time.
const WRITERS: usize = 4;
/// Keys per client, written round-robin.
const KEYS_PER_WRITER: usize = 3;
/// How often each client writes.
const PERIOD: Duration = Duration::from_millis(10);
/// Writes before the cut.
const BEFORE_CUT: Duration = Duration::from_secs(1);
/// How long the relay stays cut.
const CUT: Duration = Duration::from_millis(50);
/// Writes after the restore.
const AFTER_RESTORE: Duration = Duration::from_secs(3);
/// A write sent later than this after the restore must not get a 503.
///
/// The relay itself does not race: `Relay::set(Pass)` is seen by every connection it accepts
/// afterwards, so any store connection the gateway opens after the restore is relayed, and a
/// gateway that drops a failed connection and opens a new one answers even the first write sent
/// after the restore from the store (asserted separately, per client). What can still end in a 503
/// just after the restore is work the gateway began during the cut: a connection attempt or a
/// store round trip whose failure is noticed a moment after the restore, or a reconnect delay,
/// with a write sent just after the restore queued behind it. On this 2-core machine (shared with
/// other builds) a scheduling hiccup is a few tens of milliseconds, so 100 ms (ten client periods)
/// separates that from a gateway that goes on using dead connections, which fails for as long as
/// it has some left. The 503s sent within the 100 ms are counted and printed. (Measured on this
/// machine: with writes through the cut, none came after the restore; every 503 sent after a
/// restore was the first use of a connection that died idle, one per serving thread, by +8 ms.)
const TOLERANCE: Duration = Duration::from_millis(100);
/// A client gives up on one write after this (the route's timeout, store timeout and gate
/// timeout are 2 s, 2 s and 10 s); such a write counts as status 0.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);

/// What the clients do while the relay is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Traffic {
    /// They keep writing: the gateway meets the cut on its connections and gets 503s during it.
    Through,
    /// They pause from before the cut until the restore: the gateway's store connections die
    /// idle, and the first writes after the restore are the first to use them.
    Paused,
}

/// The clients' shared controls.
#[derive(Default)]
struct Controls {
    /// The next token (shared, so that a token names one write).
    tokens: AtomicU64,
    /// Set: send nothing (ticks are skipped).
    paused: AtomicBool,
    stop: AtomicBool,
    /// Writes sent and not yet answered.
    in_flight: AtomicUsize,
}

/// One write as its client saw it.
#[derive(Debug, Clone)]
struct Write {
    writer: usize,
    id: String,
    fence: u64,
    sent: Instant,
    answered: Instant,
    /// 0: no answer within [`CLIENT_TIMEOUT`].
    status: u16,
    /// The problem type's slug of a non-2xx answer.
    problem: Option<String>,
}

impl Write {
    fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Milliseconds from `origin` to `at`, negative before it.
fn offset_ms(at: Instant, origin: Instant) -> f64 {
    match at.checked_duration_since(origin) {
        Some(after) => after.as_secs_f64() * 1e3,
        None => -(origin.duration_since(at).as_secs_f64() * 1e3),
    }
}

/// The fenced route `acct` with the given ordering.
fn route(upstream: &RecordingUpstream, ordering: &str) -> String {
    let route = fenced_route("acct", &upstream.url(), "enforce", "monotonic").replace(
        "compare = \"monotonic\"",
        &format!("compare = \"monotonic\"\nordering = \"{ordering}\""),
    );
    assert!(
        route.contains(&format!("ordering = \"{ordering}\"")),
        "the route template changed: {route}"
    );
    route
}

/// One client: a write every [`PERIOD`] (one at a time, none while paused) until stopped,
/// round-robin over its keys, each with the next token.
async fn writer(url: String, writer: usize, controls: Arc<Controls>) -> Vec<Write> {
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writes = Vec::new();
    let mut n = 0usize;
    loop {
        ticks.tick().await;
        if controls.stop.load(Ordering::SeqCst) {
            break;
        }
        controls.in_flight.fetch_add(1, Ordering::SeqCst);
        if controls.paused.load(Ordering::SeqCst) {
            controls.in_flight.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let id = format!("w{writer}k{}", n % KEYS_PER_WRITER);
        n += 1;
        let fence = controls.tokens.fetch_add(1, Ordering::SeqCst) + 1;
        let fence_text = fence.to_string();
        let sent = Instant::now();
        let reply = tokio::time::timeout(
            CLIENT_TIMEOUT,
            send(
                "PUT",
                &format!("{url}/acct/{id}"),
                &[("x-fence", fence_text.as_str())],
                "",
            ),
        )
        .await;
        let answered = Instant::now();
        controls.in_flight.fetch_sub(1, Ordering::SeqCst);
        let (status, problem) = match reply {
            Ok(reply) => {
                let status = reply.status.as_u16();
                let problem = (!reply.status.is_success()).then(|| {
                    serde_json::from_slice::<serde_json::Value>(&reply.body)
                        .ok()
                        .and_then(|body| body["type"].as_str().map(str::to_owned))
                        .and_then(|kind| kind.rsplit('/').next().map(str::to_owned))
                        .unwrap_or_else(|| String::from_utf8_lossy(&reply.body).into_owned())
                });
                (status, problem)
            }
            Err(_) => (0, Some("no answer".to_owned())),
        };
        writes.push(Write {
            writer,
            id,
            fence,
            sent,
            answered,
            status,
            problem,
        });
    }
    writes
}

/// What one case measured, and what it broke.
struct Outcome {
    report: String,
    violations: Vec<String>,
}

async fn recovery_case(
    backend: Backend,
    ordering: &'static str,
    traffic: Traffic,
    namespace: String,
) -> Outcome {
    let target = backend.addr();
    let relay = Relay::start(target.parse().expect("store address")).await;
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let gateway = GatewayProcess::start_with_store(
        dir.path(),
        &backend.store_toml(&relay.addr.to_string(), &namespace),
        &route(&upstream, ordering),
    );

    let controls = Arc::new(Controls::default());
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(writer(gateway.url(""), w, Arc::clone(&controls))))
        .collect();
    tokio::time::sleep(BEFORE_CUT).await;
    if traffic == Traffic::Paused {
        // The last writes are answered (their store work done) before the connections are cut.
        controls.paused.store(true, Ordering::SeqCst);
        while controls.in_flight.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(PERIOD).await;
    }
    let cut = Instant::now();
    relay.set(RelayMode::Cut);
    tokio::time::sleep(CUT).await;
    relay.set(RelayMode::Pass);
    // Taken after the relay passes again: every write sent at or after it can reach the store.
    let restore = Instant::now();
    controls.paused.store(false, Ordering::SeqCst);
    tokio::time::sleep(AFTER_RESTORE).await;
    controls.stop.store(true, Ordering::SeqCst);
    let mut writes = Vec::new();
    for handle in writers {
        writes.extend(handle.await.expect("writer task"));
    }
    drop(gateway);

    let forwarded: HashSet<(String, u64)> = upstream
        .seen()
        .iter()
        .filter_map(|s| {
            let id = s.target.strip_prefix("/acct/")?.to_owned();
            Some((id, s.fence()?))
        })
        .collect();

    let case = format!("{backend:?}, ordering = \"{ordering}\", {traffic:?} the cut");
    let mut violations = Vec::new();
    let after = |w: &&Write| w.sent >= restore;
    let is_503 = |w: &&Write| w.status == 503;
    // Writes answered before the cut (one sent just before it may meet it).
    let before_cut = writes.iter().filter(|w| w.answered < cut).count();
    let failed_before_cut = writes
        .iter()
        .filter(|w| w.answered < cut && !w.ok())
        .count();
    let before_503 = writes
        .iter()
        .filter(|w| w.sent < restore)
        .filter(is_503)
        .count();
    let after_503: Vec<&Write> = writes.iter().filter(after).filter(is_503).collect();
    let within_tolerance = after_503
        .iter()
        .filter(|w| w.sent.duration_since(restore) <= TOLERANCE)
        .count();
    let last_503 = after_503
        .iter()
        .map(|w| offset_ms(w.sent, restore))
        .fold(None, |last: Option<f64>, t| {
            Some(last.map_or(t, |l| l.max(t)))
        });
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut problems: BTreeMap<String, usize> = BTreeMap::new();
    for write in &writes {
        *statuses.entry(write.status).or_default() += 1;
        if let Some(problem) = &write.problem {
            *problems
                .entry(format!("{} {problem}", write.status))
                .or_default() += 1;
        }
    }

    let mut firsts = Vec::new();
    for w in 0..WRITERS {
        let Some(first) = writes
            .iter()
            .filter(|x| x.writer == w)
            .filter(after)
            .min_by_key(|x| x.sent)
        else {
            violations.push(format!("{case}: writer {w} sent nothing after the restore"));
            continue;
        };
        firsts.push(format!(
            "{} at +{:.1} ms (answered in {:.1} ms)",
            first.status,
            offset_ms(first.sent, restore),
            offset_ms(first.answered, first.sent)
        ));
        if !first.ok() {
            violations.push(format!(
                "{case}: writer {w}'s first write after the restore, sent at +{:.1} ms, got {} ({})",
                offset_ms(first.sent, restore),
                first.status,
                first.problem.as_deref().unwrap_or("")
            ));
        }
    }
    for write in &after_503 {
        if write.sent.duration_since(restore) > TOLERANCE {
            violations.push(format!(
                "{case}: a write sent at +{:.1} ms after the restore got 503 ({})",
                offset_ms(write.sent, restore),
                write.problem.as_deref().unwrap_or("")
            ));
        }
    }
    for write in &writes {
        let seen = forwarded.contains(&(write.id.clone(), write.fence));
        if write.ok() && !seen {
            violations.push(format!(
                "{case}: {} with token {} got {} but was never forwarded",
                write.id, write.fence, write.status
            ));
        }
        if write.status == 503 && seen {
            violations.push(format!(
                "{case}: {} with token {} got 503 ({}) but was forwarded",
                write.id,
                write.fence,
                write.problem.as_deref().unwrap_or("")
            ));
        }
    }
    if before_cut == 0 || failed_before_cut > 0 {
        violations.push(format!(
            "{case}: before the cut {failed_before_cut} of {before_cut} writes failed"
        ));
    }

    let report = format!(
        "{case}: {} writes ({} answered before the cut), statuses {statuses:?}; 503s sent before the restore: {before_503}; \
         503s sent after the restore: {} ({within_tolerance} within {} ms), last at {}; \
         first write after the restore per writer: [{}]; problems: {problems:?}",
        writes.len(),
        before_cut,
        after_503.len(),
        TOLERANCE.as_millis(),
        last_503.map_or("-".to_owned(), |t| format!("+{t:.1} ms")),
        firsts.join(", "),
    );
    Outcome { report, violations }
}

/// The two tests run one after the other: each times its writes to the millisecond, on a machine
/// with two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs both kinds of traffic and both orderings on `backend`, prints what each measured, then
/// fails on any violation.
async fn recovery(backend: Backend) {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let mut violations = Vec::new();
    for traffic in [Traffic::Through, Traffic::Paused] {
        for ordering in ["serialize", "none"] {
            let outcome = with_namespace(backend, move |namespace| {
                recovery_case(backend, ordering, traffic, namespace)
            })
            .await;
            println!("{}", outcome.report);
            violations.extend(outcome.violations);
        }
    }
    assert!(
        violations.is_empty(),
        "{} violations (the first 20):\n{}",
        violations.len(),
        violations[..violations.len().min(20)].join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_the_first_write_after_a_store_blip_succeeds() {
    recovery(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_the_first_write_after_a_store_blip_succeeds() {
    recovery(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_etcd_the_first_write_after_a_store_blip_succeeds() {
    recovery(Backend::Etcd).await;
}
