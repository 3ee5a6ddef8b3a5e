//! Resident memory per cached key: fills a `MarkCache` sized for one million keys with one million
//! distinct resource keys and reports the growth of the process's resident set, per key.
//!
//! Run with `cargo bench --bench cache_memory` (KEYS overrides the count). Linux only: it reads
//! `/proc/self/statm`.

use std::hint::black_box;

use fencegate::guard::MarkCache;

/// The allocator the `fencegate` binary uses, so the figure is the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Resident bytes of this process, from `/proc/self/statm` (pages × page size).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument is a filter we have no use for.
    let keys: usize = std::env::var("KEYS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(1_000_000);
    let Some(before) = resident_bytes() else {
        eprintln!("cache_memory: /proc/self/statm is not readable; nothing measured");
        return;
    };
    let cache = MarkCache::new(keys);
    for i in 0..keys {
        // Keys shaped like a route's rendered resource key.
        cache.raise(&format!("invoice:{}", 10_000_000 + i), i as u64);
    }
    let after = resident_bytes().unwrap_or(before);
    let grown = after.saturating_sub(before);
    println!(
        "cache_memory: {} keys cached ({} in the cache), resident set grew by {:.1} MiB: {:.0} bytes per key",
        keys,
        black_box(cache.len()),
        grown as f64 / (1024.0 * 1024.0),
        grown as f64 / keys as f64
    );
}
