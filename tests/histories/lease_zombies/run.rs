//! One mode's run of the lease-zombie history on one lock service: the workers, what each zombie
//! write met, the upstream's record checked for I1 and against the answers, and the watch's lag.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::service::{Ack, Ended, LockService};
use crate::support::locks::{authority_revision, pooled_client};
use crate::support::upstream::{Behavior, RecordingUpstream};
use crate::support::{send, TestGateway};

/// Workers per lock: two contend for each of the first locks (a lease that ends passes the lock
/// to the waiting one), one alone takes the last (a lease that ends leaves it free).
const WORKERS_PER_LOCK: [usize; 3] = [2, 2, 1];
const LOCKS: usize = WORKERS_PER_LOCK.len();
/// A new holder's work before its first write (the window plain fencing leaves open).
const PREPARE: Duration = Duration::from_millis(150);
const HOLDER_WRITES: usize = 3;
pub(super) const ZOMBIE_WRITES: usize = 4;
const ADMIN_TOKEN: &str = "lease-zombies-admin";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Plain,
    Watch,
    Strict,
}

/// One zombie write as its worker saw it.
#[derive(Debug, Clone)]
struct ZombieWrite {
    id: u64,
    /// Whether the gateway had seen the lease's end when the write was sent.
    seen: bool,
    status: u16,
}

#[derive(Default)]
struct Record {
    zombies: Mutex<Vec<ZombieWrite>>,
    /// Changes acknowledged to lock clients, by revision (services with revisions).
    acks: Mutex<Vec<Ack>>,
    /// Lags measured by the service itself (services without revisions), in milliseconds.
    lags: Mutex<Vec<f64>>,
    next_write: AtomicU64,
}

struct Run<S> {
    service: S,
    gateway: TestGateway,
    admin_url: String,
    mode: Mode,
    record: Record,
    deadline: Instant,
}

/// What one mode's run counted.
#[derive(Debug)]
pub(super) struct Report {
    pub(super) mode: Mode,
    pub(super) tried: usize,
    pub(super) refused: usize,
    pub(super) forwarded: usize,
    /// Zombie writes the gateway had seen the end of, and of those forwarded.
    pub(super) seen: usize,
    pub(super) seen_forwarded: usize,
    pub(super) holder_writes: usize,
    pub(super) lag_ms: Option<(f64, f64)>,
}

async fn put<S>(run: &Run<S>, lock: usize, token: u64) -> (u64, u16) {
    let id = run.record.next_write.fetch_add(1, Ordering::Relaxed);
    let reply = send(
        "PUT",
        &run.gateway.url(&format!("/res/{lock}?w={id}")),
        &[("x-fence", &token.to_string())],
        "x",
    )
    .await;
    (id, reply.status.as_u16())
}

async fn worker<S: LockService>(run: Arc<Run<S>>, lock: usize, worker: usize) -> usize {
    let mut holder_writes = 0;
    let mut cycle = worker;
    while Instant::now() < run.deadline {
        let (lease, ack) = run.service.contend(lock, worker).await;
        run.record.acks.lock().expect("acks").extend(ack);
        run.service.until_holder(&lease).await;
        let token = S::token(&lease);
        tokio::time::sleep(PREPARE).await;
        for _ in 0..HOLDER_WRITES {
            put(&run, lock, token).await;
            holder_writes += 1;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        cycle += 1;
        if cycle.is_multiple_of(2) {
            // The pause: no renewals; the lease ends while this worker still thinks it holds.
            let watching = (run.mode == Mode::Watch).then_some(&run.gateway);
            let ended = run.service.pause_until_ended(lease, worker, watching).await;
            if let Ended::Applied { lag } = ended {
                run.record
                    .lags
                    .lock()
                    .expect("lags")
                    .push(lag.as_secs_f64() * 1000.0);
            }
            let client = pooled_client();
            for _ in 0..ZOMBIE_WRITES {
                let seen = match ended {
                    Ended::AtRevision(end) => {
                        run.mode != Mode::Plain
                            && authority_revision(&client, &run.admin_url, ADMIN_TOKEN).await >= end
                    }
                    Ended::Applied { .. } => true,
                    Ended::Visible => false,
                };
                let (id, status) = put(&run, lock, token).await;
                run.record
                    .zombies
                    .lock()
                    .expect("zombies")
                    .push(ZombieWrite { id, seen, status });
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            let ack = run.service.release(lease).await;
            run.record.acks.lock().expect("acks").extend(ack);
        }
    }
    holder_writes
}

/// Polls the gateway's watch revision until `deadline`: when it reached each value.
async fn follow_revision(admin_url: String, deadline: Instant) -> Vec<(Instant, i64)> {
    let client = pooled_client();
    let mut reached = Vec::new();
    let mut last = 0;
    while Instant::now() < deadline {
        let revision = authority_revision(&client, &admin_url, ADMIN_TOKEN).await;
        if revision > last {
            reached.push((Instant::now(), revision));
            last = revision;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    reached
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Per resource, the tokens forwarded never go down (I1); answers the ids of the writes the
/// upstream received.
fn check_record(upstream: &RecordingUpstream, mode: Mode) -> HashSet<u64> {
    let arrived: Vec<(String, u64, u64)> = upstream
        .seen()
        .iter()
        .filter_map(|s| {
            let (path, query) = s.target.split_once('?')?;
            let id = query.strip_prefix("w=")?.parse().ok()?;
            Some((path.to_owned(), id, s.fence()?))
        })
        .collect();
    for lock in 0..LOCKS {
        let path = format!("/res/{lock}");
        let tokens: Vec<u64> = arrived
            .iter()
            .filter(|(p, _, _)| *p == path)
            .map(|(_, _, t)| *t)
            .collect();
        assert!(
            tokens.windows(2).all(|w| w[0] <= w[1]),
            "{mode:?}: I1 broken on {path}: forwarded tokens went down: {tokens:?}"
        );
    }
    arrived.iter().map(|(_, id, _)| *id).collect()
}

/// Runs `mode` on fresh locks of `S` for `S::RUN`.
pub(super) async fn run_mode<S: LockService>(mode: Mode) -> Report {
    let service = S::open(LOCKS).await;
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let authority = match mode {
        Mode::Plain => String::new(),
        Mode::Watch | Mode::Strict => format!(
            "[routes.fence.authority]\n{}require_live_lease = true\nstrict = {}\n",
            service.authority(),
            mode == Mode::Strict
        ),
    };
    let routes = format!(
        "[[routes]]\nname = \"res\"\npath = \"/res/{{id}}\"\nupstream = \"{}\"\nresource_key = \"res:{{id}}\"\n\n{authority}",
        upstream.url()
    );
    let gateway = TestGateway::builder(&routes)
        .admin(ADMIN_TOKEN)
        .start()
        .await;
    let deadline = Instant::now() + S::RUN;
    let run = Arc::new(Run {
        admin_url: gateway.admin_url("/admin/authorities"),
        service,
        gateway,
        mode,
        record: Record::default(),
        deadline,
    });
    let poller = (mode == Mode::Watch && S::REVISIONS)
        .then(|| tokio::spawn(follow_revision(run.admin_url.clone(), deadline)));
    let mut workers = Vec::new();
    for (lock, count) in WORKERS_PER_LOCK.into_iter().enumerate() {
        for _ in 0..count {
            let index = workers.len();
            workers.push(tokio::spawn(worker(Arc::clone(&run), lock, index)));
        }
    }
    let mut holder_writes = 0;
    for worker in workers {
        holder_writes += worker.await.expect("worker");
    }
    let reached = match poller {
        Some(poller) => poller.await.expect("poller"),
        None => Vec::new(),
    };
    let Ok(run) = Arc::try_unwrap(run) else {
        unreachable!("every worker has ended")
    };

    let forwarded_ids = check_record(&upstream, mode);
    let zombies = run.record.zombies.lock().expect("zombies").clone();
    for zombie in &zombies {
        assert_eq!(
            forwarded_ids.contains(&zombie.id),
            zombie.status == 200,
            "{mode:?}: write {} answered {} but the upstream's record disagrees",
            zombie.id,
            zombie.status
        );
    }
    let forwarded = zombies
        .iter()
        .filter(|z| forwarded_ids.contains(&z.id))
        .count();
    let seen = zombies.iter().filter(|z| z.seen).count();
    let seen_forwarded = zombies
        .iter()
        .filter(|z| z.seen && forwarded_ids.contains(&z.id))
        .count();
    let mut lags = run.record.lags.lock().expect("lags").clone();
    lags.extend(
        run.record
            .acks
            .lock()
            .expect("acks")
            .iter()
            .filter_map(|(revision, acked)| {
                let (when, _) = reached.iter().find(|(_, r)| r >= revision)?;
                Some(when.saturating_duration_since(*acked).as_secs_f64() * 1000.0)
            }),
    );
    lags.sort_by(f64::total_cmp);
    let lag_ms = (!lags.is_empty()).then(|| (percentile(&lags, 0.5), percentile(&lags, 0.99)));
    run.gateway.stop().await;
    run.service.close().await;
    Report {
        mode,
        tried: zombies.len(),
        refused: zombies.len() - forwarded,
        forwarded,
        seen,
        seen_forwarded,
        holder_writes,
        lag_ms,
    }
}
