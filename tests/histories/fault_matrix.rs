//! The fault matrix (issue 8 item 5): the store cut, stalled and reset mid-operation (PostgreSQL,
//! Redis); the upstream refusing, resetting mid-body, slow and never answering (every store); the
//! gateway killed with `kill -9` while forwarding, then restarted on the same store (every store).
//! Every cell runs concurrent writers with rising tokens over a few keys, injects its fault
//! mid-run (while forwards are in flight, for store faults and kills), lifts it, and asserts I1,
//! I2, I5 and I7 of docs/design.md §1 — and that the gateway then serves a fresh accepted write.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;

use crate::support;
use crate::support::cell_clients::{writer, Clients, MAX_STEPS, WRITERS_PER_KEY};
use crate::support::cell_gateway::Gateway;
use crate::support::cell_store::{Backing, Store};
use crate::support::fault_checks::{
    check_answers, check_fail_closed, check_forward_counts, check_marks_cover, check_marks_sent,
    check_no_stale_forward, class, tally, Role, Sent,
};
use crate::support::fault_upstream::{Arrival, FaultyUpstream, UpstreamFault};
use crate::support::outcome::Outcome;
use crate::support::relay::RelayMode;
use crate::support::TestGateway;

/// Keys the writers share; [`WRITERS_PER_KEY`] writers per key race with interleaved rising tokens.
const KEYS: u64 = 3;
/// Requests sent while the fault is in force, each on a key of its own from this one up.
const PROBES: u64 = 3;
const PROBE_KEY: u64 = 100;
/// The token of the last write per key: above every token the writers use.
const FRESH_TOKEN: u64 = 1_000_000;
const _: () = assert!(FRESH_TOKEN > (MAX_STEPS + 1) * WRITERS_PER_KEY);
/// Requests the upstream must see before the fault, and again after it is lifted.
const PROGRESS: usize = 6;
/// How long the fault lasts (at least; probes may take longer).
const FAULT_HOLD: Duration = Duration::from_millis(700);
/// Bounds on waiting for traffic, a restart or a recovery: they detect hangs, nothing else.
const PROGRESS_BOUND: Duration = Duration::from_secs(30);
/// The upstream's delay in the store and `kill -9` cells, so forwards (and, on PostgreSQL, their
/// per-key gate connections) are in flight when the fault hits.
const IN_FLIGHT_DELAY: Duration = Duration::from_millis(150);
/// How long the killed gateway stays down before it is restarted.
const DOWN_FOR: Duration = Duration::from_millis(300);
const SLOW: Duration = Duration::from_millis(300);
/// Outcome classes every cell may see.
const OK: &str = "200";
const STALE: &str = "409/stale-fence";
const STORE_OUT: &str = "503/store-unavailable";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The relay between the gateway and its store misbehaves.
    Store(RelayMode),
    /// The upstream misbehaves.
    Upstream(UpstreamFault),
    /// The gateway (the real binary) is killed with SIGKILL while forwarding, then restarted.
    Kill9,
}

impl Fault {
    /// The outcomes (as [`class`] names them) any request of the cell may have. A store slower
    /// than `store_timeout` is refused with 503 in every cell: a loaded machine can cause that,
    /// and it is a correct refusal (I5) that the forward counts check.
    fn allowed(self) -> &'static [&'static str] {
        match self {
            Fault::Upstream(UpstreamFault::Refuse) => {
                &[OK, STALE, STORE_OUT, "502/upstream-unavailable"]
            }
            Fault::Upstream(UpstreamFault::ResetMidBody) => {
                &[OK, STALE, STORE_OUT, "502/upstream-unavailable", "broken"]
            }
            Fault::Upstream(UpstreamFault::NeverAnswer) => {
                &[OK, STALE, STORE_OUT, "504/upstream-timeout"]
            }
            Fault::Store(_) | Fault::Upstream(_) => &[OK, STALE, STORE_OUT],
            Fault::Kill9 => &[OK, STALE, STORE_OUT, "no-answer", "broken"],
        }
    }

    /// How long the route waits for the store: short where the store is the fault, so the cell
    /// stays short; generous elsewhere, so a loaded machine does not turn the cell into a store
    /// outage.
    fn store_timeout(self) -> &'static str {
        match self {
            Fault::Store(_) => "300ms",
            _ => "5s",
        }
    }

    /// What a probe sent while the fault is in force gets, and how often the upstream may see it
    /// (a request racing the refusal on an open connection arrives, and is reset with it).
    fn probe_expectation(self) -> (&'static str, RangeInclusive<usize>) {
        match self {
            Fault::Store(_) => ("503/store-unavailable", 0..=0),
            Fault::Upstream(UpstreamFault::Refuse) => ("502/upstream-unavailable", 0..=1),
            // The serialized route reads the response ahead (to end the key's turn with the
            // upstream), so the reset is seen before the head is passed on: a clean 502.
            Fault::Upstream(UpstreamFault::ResetMidBody) => ("502/upstream-unavailable", 1..=1),
            Fault::Upstream(UpstreamFault::NeverAnswer) => ("504/upstream-timeout", 1..=1),
            Fault::Upstream(_) => ("200", 1..=1),
            Fault::Kill9 => ("no-answer", 0..=0),
        }
    }
}

macro_rules! matrix {
    ($($name:ident: $store:expr, $fault:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            run_cell(stringify!($name), $store, $fault).await;
        }
    )*};
}

matrix! {
    postgres_store_cut: Store::Postgres, Fault::Store(RelayMode::Cut);
    postgres_store_stalled: Store::Postgres, Fault::Store(RelayMode::Stall);
    postgres_store_reset_mid_operation: Store::Postgres, Fault::Store(RelayMode::Reset);
    redis_store_cut: Store::Redis, Fault::Store(RelayMode::Cut);
    redis_store_stalled: Store::Redis, Fault::Store(RelayMode::Stall);
    redis_store_reset_mid_operation: Store::Redis, Fault::Store(RelayMode::Reset);
    embedded_upstream_refusing: Store::Embedded, Fault::Upstream(UpstreamFault::Refuse);
    embedded_upstream_reset_mid_body: Store::Embedded, Fault::Upstream(UpstreamFault::ResetMidBody);
    embedded_upstream_slow: Store::Embedded, Fault::Upstream(UpstreamFault::Slow(SLOW));
    embedded_upstream_never_answering: Store::Embedded, Fault::Upstream(UpstreamFault::NeverAnswer);
    postgres_upstream_refusing: Store::Postgres, Fault::Upstream(UpstreamFault::Refuse);
    postgres_upstream_reset_mid_body: Store::Postgres, Fault::Upstream(UpstreamFault::ResetMidBody);
    postgres_upstream_slow: Store::Postgres, Fault::Upstream(UpstreamFault::Slow(SLOW));
    postgres_upstream_never_answering: Store::Postgres, Fault::Upstream(UpstreamFault::NeverAnswer);
    redis_upstream_refusing: Store::Redis, Fault::Upstream(UpstreamFault::Refuse);
    redis_upstream_reset_mid_body: Store::Redis, Fault::Upstream(UpstreamFault::ResetMidBody);
    redis_upstream_slow: Store::Redis, Fault::Upstream(UpstreamFault::Slow(SLOW));
    redis_upstream_never_answering: Store::Redis, Fault::Upstream(UpstreamFault::NeverAnswer);
    embedded_gateway_kill_9_while_forwarding: Store::Embedded, Fault::Kill9;
    postgres_gateway_kill_9_while_forwarding: Store::Postgres, Fault::Kill9;
    redis_gateway_kill_9_while_forwarding: Store::Redis, Fault::Kill9;
}

/// The route every cell writes through: fenced, serialized per key, a short upstream timeout so
/// faults show quickly.
fn route(upstream: &FaultyUpstream, store_timeout: &str) -> String {
    format!(
        "[[routes]]\nname = \"w\"\npath = \"/w/{{id}}\"\nupstream = \"{}\"\nresource_key = \"w:{{id}}\"\ntimeout = \"1s\"\n\n[routes.fence]\nstore_timeout = \"{store_timeout}\"\n\n",
        upstream.url()
    )
}

/// The writers' keys and the probes' keys.
fn all_keys() -> impl Iterator<Item = u64> + Clone {
    (0..KEYS).chain(PROBE_KEY..PROBE_KEY + PROBES)
}

/// The largest token the upstream saw for `key`.
fn newest_forwarded(arrivals: &[Arrival], key: u64) -> Option<u64> {
    let target = format!("/w/{key}");
    arrivals
        .iter()
        .filter(|a| a.target == target)
        .filter_map(|a| a.fence)
        .max()
}

/// Polls `done` until it holds, panicking (a hang) after [`PROGRESS_BOUND`].
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PROGRESS_BOUND;
    while !done() {
        assert!(Instant::now() < deadline, "hung waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run_cell(name: &str, store: Store, fault: Fault) {
    let backing = Backing::new(store).await;
    let outcome = AssertUnwindSafe(cell(name, fault, &backing))
        .catch_unwind()
        .await;
    // Clean up the cell's schema or prefix whether it passed or not.
    backing.clean_up().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn cell(name: &str, fault: Fault, backing: &Backing) {
    let upstream = FaultyUpstream::start().await;
    if matches!(fault, Fault::Kill9 | Fault::Store(_)) {
        upstream.set(UpstreamFault::Slow(IN_FLIGHT_DELAY));
    }
    let route = route(&upstream, fault.store_timeout());
    let mut gateway = if fault == Fault::Kill9 {
        Gateway::start_process(backing.dir.path(), &backing.toml(), &route).await
    } else {
        Gateway::InProcess(
            TestGateway::builder(&route)
                .in_dir(backing.dir.path())
                .store_toml(&backing.toml())
                .start()
                .await,
        )
    };
    let clients = Arc::new(Clients::new(gateway.base()));
    let writers: Vec<_> = (0..KEYS)
        .flat_map(|key| (0..WRITERS_PER_KEY).map(move |lane| (key, lane)))
        .map(|(key, lane)| tokio::spawn(writer(Arc::clone(&clients), key, lane)))
        .collect();
    wait_for("traffic on every key before the fault", || {
        let arrivals = upstream.arrivals();
        (0..KEYS).all(|key| newest_forwarded(&arrivals, key).is_some())
            && arrivals.len() >= PROGRESS
    })
    .await;

    // The fault, mid-run, with probes sent while it is in force.
    let send_probes = |clients: Arc<Clients>| async move {
        let probes = (0..PROBES).map(|i| {
            let clients = Arc::clone(&clients);
            async move { clients.send(PROBE_KEY + i, 10, Role::Probe).await }
        });
        futures_util::future::join_all(probes).await
    };
    let out = Instant::now();
    match fault {
        Fault::Store(mode) => backing.relay().set(mode),
        Fault::Upstream(behaviour) => upstream.set(behaviour),
        Fault::Kill9 => {
            wait_for("a forward in flight", || upstream.in_flight() > 0).await;
            if let Gateway::Process { process, .. } = std::mem::replace(&mut gateway, Gateway::Down)
            {
                process.kill_9();
            }
        }
    }
    let probes = send_probes(Arc::clone(&clients)).await;
    tokio::time::sleep_until((out + FAULT_HOLD).into()).await;
    if fault == Fault::Kill9 {
        tokio::time::sleep(DOWN_FOR).await;
    }
    let back = Instant::now();
    match fault {
        Fault::Store(_) => backing.relay().set(RelayMode::Pass),
        Fault::Upstream(_) => upstream.set(UpstreamFault::None),
        Fault::Kill9 => {
            gateway = Gateway::start_process(backing.dir.path(), &backing.toml(), &route).await;
        }
    }
    // Right after the fault (after a kill: before the restarted gateway takes any request), the
    // store's marks, read after this record of what the upstream saw, must cover it (I2).
    let arrived_before = upstream.arrivals();
    let marks_after_fault = gateway.marks(all_keys(), PROGRESS_BOUND).await;
    *clients.base.write().expect("base lock") = gateway.base();

    // A token below the newest one forwarded per key is refused.
    for key in 0..KEYS {
        let newest =
            newest_forwarded(&arrived_before, key).expect("every key was forwarded before");
        let deadline = Instant::now() + PROGRESS_BOUND;
        loop {
            // A store still reconnecting refuses with 503; the zombie is sent again.
            let zombie = clients.send(key, newest - 1, Role::Zombie).await;
            if class(&zombie) != STORE_OUT || Instant::now() > deadline {
                assert_eq!(
                    zombie.status(),
                    Some(409),
                    "{name}: zombie on key {key}: {zombie:?}"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let resumed = arrived_before.len() + PROGRESS;
    wait_for("traffic after the fault", || {
        upstream.arrivals().len() >= resumed
    })
    .await;
    clients.stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("writer task");
    }
    upstream.set(UpstreamFault::None);

    // The gateway serves again: a new generation per key is accepted and forwarded.
    for key in 0..KEYS {
        let deadline = Instant::now() + PROGRESS_BOUND;
        loop {
            let fresh = clients.send(key, FRESH_TOKEN + key, Role::Fresh).await;
            if fresh.status() == Some(200) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: key {key} never served again: {fresh:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let sent = clients.sent();
    let arrivals = upstream.arrivals();
    let marks = gateway.marks(all_keys(), PROGRESS_BOUND).await;
    let fail = |invariant: &str, violation: String| -> ! {
        panic!(
            "{name}: {invariant}: {violation}\noutcomes: {:?}",
            tally(&sent)
        )
    };

    // I7: every request got an answer of the kind the fault allows, or a connection error.
    check_answers(&sent, fault.allowed()).unwrap_or_else(|v| fail("I7", v));
    let (expected, forwarded) = fault.probe_expectation();
    for probe in &probes {
        assert_eq!(probe.label(), expected, "{name}: probe: {probe:?}");
    }
    for probe in sent.iter().filter(|s| s.role == Role::Probe) {
        let times = arrivals.iter().filter(|a| a.seq == Some(probe.seq)).count();
        assert!(
            forwarded.contains(&times),
            "{name}: probe #{} reached the upstream {times} times",
            probe.seq
        );
    }
    // I1: nothing stale reached the upstream; refusals never did, answers exactly once.
    check_no_stale_forward(&sent, &arrivals).unwrap_or_else(|v| fail("I1", v));
    check_forward_counts(&sent, &arrivals).unwrap_or_else(|v| fail("I1", v));
    // I2: no mark below a token the upstream saw, right after the fault and at the end; no mark
    // above every token sent.
    check_marks_cover(&marks_after_fault, &arrived_before).unwrap_or_else(|v| fail("I2", v));
    check_marks_cover(&marks, &arrivals).unwrap_or_else(|v| fail("I2", v));
    check_marks_sent(&marks_after_fault, &sent).unwrap_or_else(|v| fail("I2", v));
    check_marks_sent(&marks, &sent).unwrap_or_else(|v| fail("I2", v));
    // I5: while the store was out, nothing was forwarded.
    let inside = match fault {
        Fault::Store(_) => {
            check_fail_closed(&sent, &arrivals, out, back).unwrap_or_else(|v| fail("I5", v))
        }
        _ => 0,
    };
    if fault == Fault::Store(RelayMode::Reset) {
        assert!(
            backing.relay().lost_replies() > 0,
            "{name}: no store reply was lost to a reset"
        );
    }
    if fault == Fault::Kill9 {
        // The kill hit a forward: a request reached the upstream and its client got no answer.
        let cut_off = sent
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::NoAnswer(_) | Outcome::BrokenBody { .. }))
            .filter(|s| arrivals.iter().any(|a| a.seq == Some(s.seq)))
            .count();
        assert!(cut_off > 0, "{name}: no forward was in flight at the kill");
    }
    // Marks an advance set although its client was refused with 503 (a reply lost to a reset, an
    // operation delivered after a stall), as later 409s report them: counted, not required.
    let unanswered_marks = sent
        .iter()
        .filter_map(|s| match &s.outcome {
            Outcome::Answered(answer) if answer.status == 409 => Some((s.key, answer.current?)),
            _ => None,
        })
        .filter(|(key, current)| {
            sent.iter()
                .filter(|s| s.key == *key && s.token == *current)
                .all(|s| class(&s.outcome) == STORE_OUT)
        })
        .collect::<std::collections::HashSet<_>>()
        .len();
    let mut marks: Vec<_> = marks_after_fault.into_iter().collect();
    marks.sort();
    eprintln!(
        "{name}: {} requests, upstream saw {}, {inside} inside the store outage, {unanswered_marks} marks set by refused requests, outcomes {:?}, marks after the fault {marks:?}",
        sent.len(),
        arrivals.len(),
        tally(&sent)
    );
}

/// Each check of the matrix can fail: a history that breaks its invariant is flagged.
#[test]
fn the_fault_checks_flag_violations() {
    use support::outcome::Answer;
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let answered = |status: u16, problem: Option<&str>, current: Option<u64>| {
        Outcome::Answered(Answer {
            status,
            content_type: problem.map(|_| "application/problem+json".to_owned()),
            problem: problem.map(str::to_owned),
            current,
            body: if problem.is_some() {
                bytes::Bytes::from_static(b"{}")
            } else {
                bytes::Bytes::from_static(support::fault_upstream::OK_BODY)
            },
        })
    };
    let sent = |seq, token, from, to, outcome| Sent {
        seq,
        key: 1,
        token,
        role: Role::Workload,
        sent: at(from),
        answered: at(to),
        outcome,
    };
    let arrival = |seq, token, ms| Arrival {
        seq: Some(seq),
        target: "/w/1".to_owned(),
        fence: Some(token),
        arrived: at(ms),
    };
    let ok = |seq, token, from, to| sent(seq, token, from, to, answered(200, None, None));
    let history = vec![ok(1, 10, 0, 5), ok(2, 12, 6, 9)];
    let forwarded = vec![arrival(1, 10, 1), arrival(2, 12, 7)];
    check_no_stale_forward(&history, &forwarded).expect("a legal history");
    check_forward_counts(&history, &forwarded).expect("a legal history");

    // I1: a lower token reaching the upstream after a higher one, even if its client got 504.
    let late = vec![
        ok(1, 10, 0, 5),
        sent(2, 9, 1, 9, answered(504, Some("upstream-timeout"), None)),
    ];
    let violation =
        check_no_stale_forward(&late, &[arrival(1, 10, 1), arrival(2, 9, 6)]).unwrap_err();
    assert!(violation.contains("token 9"), "{violation}");
    // A 503 that reached the upstream; a 200 that reached it twice.
    let refused = vec![sent(
        1,
        10,
        0,
        5,
        answered(503, Some("store-unavailable"), None),
    )];
    assert!(check_forward_counts(&refused, &[arrival(1, 10, 1)]).is_err());
    assert!(check_forward_counts(&history, &[arrival(1, 10, 1), arrival(1, 10, 2)]).is_err());
    // I2: a mark below a token the upstream saw, or above every token sent.
    let marks = |mark| HashMap::from([(1u64, mark)]);
    check_marks_cover(&marks(Some(12)), &forwarded).expect("marks kept");
    check_marks_sent(&marks(Some(12)), &history).expect("marks kept");
    assert!(check_marks_cover(&marks(Some(10)), &forwarded).is_err());
    assert!(check_marks_cover(&marks(None), &forwarded).is_err());
    assert!(check_marks_sent(&marks(Some(13)), &history).is_err());
    // I5: a request sent and answered while the store was out was forwarded.
    assert!(check_fail_closed(&history, &forwarded, at(6), at(10)).is_err());
    assert_eq!(check_fail_closed(&refused, &[], at(0), at(10)), Ok(1));
    // I7: a hang, an outcome the fault does not allow, a refusal without a problem body.
    let hung = vec![sent(1, 10, 0, 5, Outcome::Hung)];
    assert!(check_answers(&hung, Fault::Kill9.allowed()).is_err());
    assert!(check_answers(&refused, &["200", "409"]).is_err());
    let bare = vec![sent(1, 10, 0, 5, answered(502, None, None))];
    assert!(check_answers(&bare, &["502"]).is_err());
    check_answers(&refused, Fault::Store(RelayMode::Cut).allowed()).expect("503 allowed");
}
