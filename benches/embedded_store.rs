//! Durable compare-and-advance throughput of the embedded store, next to the disk's raw fsync rate.
//!
//! Measures, in one run: (a) how many `write 8 bytes + fsync` the disk does per second, (b) the
//! store with `max_batch = 1` (one commit and one fsync per advance) and (c) the store with group
//! commit (`max_batch = 512`, the default), at several concurrencies. Concurrency `n` is `n` tokio
//! tasks, each advancing its own key with strictly increasing tokens, so every advance is a real
//! write that must be durable before it is answered.
//!
//! `cargo bench --bench embedded_store`. Environment:
//! - `FENCEGATE_BENCH_SECS`: seconds per measurement (default 2).
//! - `FENCEGATE_BENCH_DIR`: directory for the temporary files (default: the system temp dir). It
//!   must sit on the disk you want to measure; a tmpfs makes every number meaningless.
//!
//! Run by `cargo test --all-targets` (no `--bench` argument), it does one short smoke pass instead.

use std::fs::File;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencegate::config::Compare;
use fencegate::store::{Advance, EmbeddedStore, FenceStore};
use tempfile::TempDir;

/// Seconds per measurement when `FENCEGATE_BENCH_SECS` is not set.
const DEFAULT_SECS: f64 = 2.0;
/// Runs per configuration; the table reports the median throughput.
const REPEATS: usize = 3;
/// `max_batch` of the group-commit configuration: the shipped default.
const GROUP_COMMIT_BATCH: usize = fencegate::config::DEFAULT_MAX_BATCH;

/// The configurations of the table, in order: (label, max_batch, concurrency).
const CONFIGURATIONS: [(&str, usize, usize); 6] = [
    ("max_batch = 1 (fsync per advance)", 1, 1),
    ("max_batch = 1 (fsync per advance)", 1, 64),
    ("max_batch = 512 (group commit)", GROUP_COMMIT_BATCH, 1),
    ("max_batch = 512 (group commit)", GROUP_COMMIT_BATCH, 16),
    ("max_batch = 512 (group commit)", GROUP_COMMIT_BATCH, 64),
    ("max_batch = 512 (group commit)", GROUP_COMMIT_BATCH, 256),
];

struct Settings {
    duration: Duration,
    repeats: usize,
    dir: Option<PathBuf>,
}

/// One timed run of the store.
struct Run {
    advances: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.advances as f64 / self.elapsed.as_secs_f64()
    }
}

fn main() {
    let settings = settings();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime must start for the benchmark");

    let location = settings
        .dir
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .display()
        .to_string();
    println!(
        "embedded store benchmark: {:.1} s per run, {} run(s) per configuration, files in {location}, {} CPU(s)",
        settings.duration.as_secs_f64(),
        settings.repeats,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    println!();

    let fsyncs = fsync_rate(&settings);
    println!(
        "raw disk: {fsyncs:.0} fsync/s (write 8 bytes in place + File::sync_data, one thread, {:.1} s)",
        settings.duration.as_secs_f64()
    );
    println!();

    println!(
        "| configuration | concurrency | advances/s (median of {}) | p50 | p99 |",
        settings.repeats
    );
    println!("|---|---:|---:|---:|---:|");
    for (label, max_batch, concurrency) in CONFIGURATIONS {
        let mut runs: Vec<Run> = (0..settings.repeats)
            .map(|_| runtime.block_on(run_store(&settings, max_batch, concurrency)))
            .collect();
        runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
        let median = runs[runs.len() / 2].rate();
        let mut latencies: Vec<Duration> = runs.into_iter().flat_map(|r| r.latencies).collect();
        latencies.sort_unstable();
        println!(
            "| {label} | {concurrency} | {median:.0} | {} | {} |",
            format_latency(percentile(&latencies, 0.50)),
            format_latency(percentile(&latencies, 0.99)),
        );
    }
    println!();
    println!(
        "p50/p99: latency of one advance (send to durable answer), over all {} run(s) of a row.",
        settings.repeats
    );
}

fn settings() -> Settings {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it.
    let benching = std::env::args().any(|a| a == "--bench");
    let secs = std::env::var("FENCEGATE_BENCH_SECS")
        .ok()
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|secs| secs.is_finite() && *secs > 0.0)
                .unwrap_or_else(|| panic!("FENCEGATE_BENCH_SECS={s:?} is not a positive number"))
        })
        .unwrap_or(DEFAULT_SECS);
    let dir = std::env::var_os("FENCEGATE_BENCH_DIR").map(PathBuf::from);
    if benching {
        Settings {
            duration: Duration::from_secs_f64(secs),
            repeats: REPEATS,
            dir,
        }
    } else {
        Settings {
            duration: Duration::from_millis(50),
            repeats: 1,
            dir,
        }
    }
}

fn temp_dir(settings: &Settings) -> TempDir {
    let made = match &settings.dir {
        Some(dir) => tempfile::Builder::new()
            .prefix("fencegate-bench-")
            .tempdir_in(dir),
        None => tempfile::Builder::new()
            .prefix("fencegate-bench-")
            .tempdir(),
    };
    made.expect("the benchmark needs a writable temporary directory")
}

/// (a): how many 8-byte writes, each followed by `sync_data`, the disk completes per second. The
/// write overwrites the same 8 bytes so that the file's size (metadata) never changes.
fn fsync_rate(settings: &Settings) -> f64 {
    let dir = temp_dir(settings);
    let mut file = File::create(dir.path().join("fsync.bin")).expect("create the fsync probe file");
    file.write_all(&0u64.to_le_bytes())
        .expect("write the fsync probe");
    file.sync_all().expect("sync the fsync probe");
    let start = Instant::now();
    let mut syncs: u64 = 0;
    while start.elapsed() < settings.duration {
        file.seek(SeekFrom::Start(0)).expect("seek the fsync probe");
        file.write_all(&syncs.to_le_bytes())
            .expect("write the fsync probe");
        file.sync_data().expect("sync the fsync probe");
        syncs += 1;
    }
    syncs as f64 / start.elapsed().as_secs_f64()
}

/// (b) and (c): `concurrency` tasks advance their own keys on a fresh store for the set duration.
async fn run_store(settings: &Settings, max_batch: usize, concurrency: usize) -> Run {
    let dir = temp_dir(settings);
    let store = Arc::new(
        EmbeddedStore::open(&dir.path().join("fence.db"), max_batch)
            .await
            .expect("open the embedded store"),
    );
    let keys: Vec<String> = (0..concurrency).map(|i| format!("bench/{i}")).collect();

    // Create every key first so that the timed part measures updates of existing marks only.
    let warm_up: Vec<_> = keys
        .iter()
        .map(|key| {
            let store = Arc::clone(&store);
            let key = key.clone();
            tokio::spawn(async move { advance(&*store, &key, 1).await })
        })
        .collect();
    for task in warm_up {
        task.await.expect("a warm-up task panicked");
    }

    let start = Instant::now();
    let deadline = start + settings.duration;
    let tasks: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut token = 1;
                while Instant::now() < deadline {
                    token += 1;
                    let sent = Instant::now();
                    advance(&*store, &key, token).await;
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a benchmark task panicked"));
    }
    // Measured to the last answer: tasks finish the advance in flight at the deadline.
    let elapsed = start.elapsed();
    store.close().await.expect("close the embedded store");
    drop(dir);
    Run {
        advances: latencies.len(),
        elapsed,
        latencies,
    }
}

/// One advance that must raise `key`'s mark to `token`; anything else means the benchmark is not
/// measuring what it claims.
async fn advance(store: &dyn FenceStore, key: &str, token: u64) {
    let outcome = store
        .advance(key, token, Compare::Monotonic)
        .await
        .unwrap_or_else(|e| panic!("advance {key} to {token} failed: {e}"));
    let expected = Advance::Accepted {
        previous: token.checked_sub(1).filter(|p| *p > 0),
    };
    assert_eq!(outcome, expected, "advance {key} to {token}");
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn format_latency(latency: Duration) -> String {
    if latency < Duration::from_millis(1) {
        format!("{:.0} µs", latency.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", latency.as_secs_f64() * 1e3)
    }
}
