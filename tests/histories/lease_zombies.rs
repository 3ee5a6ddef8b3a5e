//! Issue 21: zombies of an etcd lock, with and without the gateway following the lock service.
//! Five workers contend for three etcd locks (2 s leases) as etcd's recipe takes them, write
//! through the gateway as holders, and half the time pause past their lease and write again — a
//! zombie's writes, sent once the lease's delete is visible. Each write names itself in the path,
//! so the upstream's record says which zombie writes were forwarded. Run three ways:
//!
//! - `plain`: no authority; a zombie passes until the next holder's first write moves the mark;
//! - `watch`: the authority follows the locks; no zombie write the gateway had seen the end of
//!   (its watch revision, read from `/admin/authorities` before the write, had reached the
//!   delete's) is forwarded;
//! - `strict`: `require_live_lease` and `strict`; no zombie write is forwarded at all.
//!
//! Also on the record: per resource, forwarded tokens never go down (I1). The watch's lag (grant
//! or release acknowledged to its client → the gateway's revision reaching it) is reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::etcd::{call, delete_keys, unique_prefix, ETCD_ADDR};
use crate::support::locks::{
    authority_revision, etcd_contend, etcd_keep_alive, pooled_client, EtcdObserver,
};
use crate::support::upstream::{Behavior, RecordingUpstream};
use crate::support::{send, TestGateway};

/// Workers per lock: two contend for each of the first locks (a lease that ends passes the lock
/// to the waiting one), one alone takes the last (a lease that ends leaves it free).
const WORKERS_PER_LOCK: [usize; 3] = [2, 2, 1];
const LOCKS: usize = WORKERS_PER_LOCK.len();
/// How long each mode runs.
const RUN: Duration = Duration::from_secs(15);
/// The workers' lease, in seconds; their pauses outlast it.
const TTL: u64 = 2;
/// A new holder's work before its first write (the window plain fencing leaves open).
const PREPARE: Duration = Duration::from_millis(150);
const HOLDER_WRITES: usize = 3;
const ZOMBIE_WRITES: usize = 4;
const ADMIN_TOKEN: &str = "lease-zombies-admin";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Watch,
    Strict,
}

/// One zombie write as its worker saw it.
#[derive(Debug, Clone)]
struct ZombieWrite {
    id: u64,
    /// Whether the gateway's watch had reached the lease's delete when the write was sent.
    seen: bool,
    status: u16,
}

#[derive(Default)]
struct Record {
    zombies: Mutex<Vec<ZombieWrite>>,
    /// Revisions acknowledged to lock clients (grants, releases), and when.
    acks: Mutex<Vec<(i64, Instant)>>,
    next_write: AtomicU64,
}

struct Run {
    gateway_url: String,
    admin_url: String,
    prefix: String,
    mode: Mode,
    record: Record,
    observer: EtcdObserver,
    deadline: Instant,
}

/// What one mode's run counted.
#[derive(Debug)]
struct Report {
    mode: Mode,
    tried: usize,
    refused: usize,
    forwarded: usize,
    /// Zombie writes the gateway had seen the end of, and of those forwarded.
    seen: usize,
    seen_forwarded: usize,
    holder_writes: usize,
    lag_ms: Option<(f64, f64)>,
}

async fn put(run: &Run, lock: usize, token: u64) -> (u64, u16) {
    let id = run.record.next_write.fetch_add(1, Ordering::Relaxed);
    let reply = send(
        "PUT",
        &format!("{}/res/{lock}?w={id}", run.gateway_url),
        &[("x-fence", &token.to_string())],
        "x",
    )
    .await;
    (id, reply.status.as_u16())
}

/// The lowest create revision under `lock/`: the holder's token.
async fn holder_of(lock: &str) -> Option<u64> {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let start = format!("{lock}/");
    let end = format!("{lock}0");
    let answer = call(
        "/v3/kv/range",
        serde_json::json!({"key": b64(start.as_bytes()), "range_end": b64(end.as_bytes()), "keys_only": true}),
    )
    .await;
    answer["kvs"]
        .as_array()?
        .iter()
        .filter_map(|kv| kv["create_revision"].as_str()?.parse().ok())
        .min()
}

async fn worker(run: Arc<Run>, lock: usize, index: usize) -> usize {
    let name = format!("{}locks/{lock}", run.prefix);
    let mut holder_writes = 0;
    let mut cycle = index;
    while Instant::now() < run.deadline {
        let mine = etcd_contend(&name, TTL).await;
        run.record
            .acks
            .lock()
            .expect("acks")
            .push((i64::try_from(mine.token).expect("revision"), Instant::now()));
        let mut renewed = Instant::now();
        let waiting = Instant::now();
        while holder_of(&name).await != Some(mine.token) {
            assert!(
                waiting.elapsed() < Duration::from_secs(20),
                "{name}: never held"
            );
            if renewed.elapsed() > Duration::from_millis(500) {
                etcd_keep_alive(mine.lease).await;
                renewed = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(PREPARE).await;
        for _ in 0..HOLDER_WRITES {
            put(&run, lock, mine.token).await;
            holder_writes += 1;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        cycle += 1;
        if cycle.is_multiple_of(2) {
            // The pause: no renewals; the lease ends while this worker still thinks it holds.
            let ended = run
                .observer
                .deleted(&mine.key, Duration::from_secs(15))
                .await;
            let client = pooled_client();
            for _ in 0..ZOMBIE_WRITES {
                let seen = run.mode != Mode::Plain
                    && authority_revision(&client, &run.admin_url, ADMIN_TOKEN).await >= ended;
                let (id, status) = put(&run, lock, mine.token).await;
                run.record
                    .zombies
                    .lock()
                    .expect("zombies")
                    .push(ZombieWrite { id, seen, status });
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            let answer = call(
                "/v3/lease/revoke",
                serde_json::json!({"ID": mine.lease.to_string()}),
            )
            .await;
            if let Some(revision) = answer["header"]["revision"]
                .as_str()
                .and_then(|r| r.parse().ok())
            {
                run.record
                    .acks
                    .lock()
                    .expect("acks")
                    .push((revision, Instant::now()));
            }
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
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    reached
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn run_mode(mode: Mode) -> Report {
    let prefix = unique_prefix();
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let authority = match mode {
        Mode::Plain => String::new(),
        Mode::Watch | Mode::Strict => format!(
            "[routes.fence.authority]\nkind = \"etcd\"\nendpoints = [\"http://{ETCD_ADDR}\"]\nlock_key = \"{prefix}locks/{{id}}\"\nrequire_live_lease = {live}\nstrict = {live}\n",
            live = mode == Mode::Strict
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
    let observer = EtcdObserver::start(&prefix).await;
    let deadline = Instant::now() + RUN;
    let run = Arc::new(Run {
        gateway_url: gateway.url(""),
        admin_url: gateway.admin_url("/admin/authorities"),
        prefix: prefix.clone(),
        mode,
        record: Record::default(),
        observer,
        deadline,
    });
    let poller = (mode == Mode::Watch)
        .then(|| tokio::spawn(follow_revision(run.admin_url.clone(), deadline)));
    let mut workers = Vec::new();
    for (lock, count) in WORKERS_PER_LOCK.into_iter().enumerate() {
        for index in 0..count {
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

    // The upstream's record: which writes arrived, in arrival order per resource.
    let seen = upstream.seen();
    let arrived: Vec<(String, u64, u64)> = seen
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
    let forwarded_ids: std::collections::HashSet<u64> =
        arrived.iter().map(|(_, id, _)| *id).collect();
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
    let seen_count = zombies.iter().filter(|z| z.seen).count();
    let seen_forwarded = zombies
        .iter()
        .filter(|z| z.seen && forwarded_ids.contains(&z.id))
        .count();
    let acks = run.record.acks.lock().expect("acks").clone();
    let mut lags: Vec<f64> = acks
        .iter()
        .filter_map(|(revision, acked)| {
            let (when, _) = reached.iter().find(|(_, r)| r >= revision)?;
            Some(when.saturating_duration_since(*acked).as_secs_f64() * 1000.0)
        })
        .collect();
    lags.sort_by(f64::total_cmp);
    let lag_ms = (!lags.is_empty()).then(|| (percentile(&lags, 0.5), percentile(&lags, 0.99)));
    gateway.stop().await;
    delete_keys(&prefix).await;
    Report {
        mode,
        tried: zombies.len(),
        refused: zombies.len() - forwarded,
        forwarded,
        seen: seen_count,
        seen_forwarded,
        holder_writes,
        lag_ms,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombies_of_an_etcd_lock_with_and_without_the_authority_watch() {
    let mut reports = Vec::new();
    for mode in [Mode::Plain, Mode::Watch, Mode::Strict] {
        reports.push(run_mode(mode).await);
    }
    eprintln!("mode    zombie writes: tried refused forwarded | seen by the watch (forwarded) | holder writes | watch lag ms (median, p99)");
    for r in &reports {
        eprintln!(
            "{:<7} {:>26} {:>7} {:>9} | {:>17} ({}) | {:>13} | {}",
            format!("{:?}", r.mode).to_lowercase(),
            r.tried,
            r.refused,
            r.forwarded,
            r.seen,
            r.seen_forwarded,
            r.holder_writes,
            r.lag_ms
                .map(|(m, p)| format!("{m:.1}, {p:.1}"))
                .unwrap_or_else(|| "-".to_owned())
        );
    }
    for r in &reports {
        assert!(r.tried > 0, "{:?}: no zombie wrote", r.mode);
    }
    let [plain, watch, strict] = &reports[..] else {
        unreachable!("three modes")
    };
    assert!(
        plain.forwarded > 0,
        "plain fencing forwards zombies until the next holder writes"
    );
    assert!(
        watch.seen > 0,
        "the watch saw lease ends before zombies wrote"
    );
    assert_eq!(
        watch.seen_forwarded, 0,
        "watch: a zombie write whose lease's end the gateway had seen was forwarded"
    );
    assert_eq!(strict.forwarded, 0, "strict: a zombie write was forwarded");
    assert!(watch.lag_ms.is_some(), "the watch's lag was measured");
}
