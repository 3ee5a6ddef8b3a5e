//! Issues 21 and 40: zombies of a lease-based lock, with and without the gateway following the
//! lock service, on every service the gateway follows (etcd, a PostgreSQL lease table,
//! ZooKeeper). Five workers contend for three locks, write through the gateway as holders, and
//! half the time pause past their lease and write again — a zombie's writes, sent once the lease's
//! end is visible in the lock service. Each write names itself in the path, so the upstream's
//! record says which zombie writes were forwarded. Run three ways:
//!
//! - `plain`: no authority; a zombie passes until the next holder's first write moves the mark;
//! - `watch`: the authority follows the locks with `require_live_lease`; no zombie write the
//!   gateway had seen the end of is forwarded. Seen: where the service has revisions, the watch's
//!   (from `/admin/authorities` before the write) had reached the end's; in the lease table, which
//!   has none, the zombie waits until the gateway's marks show two later changes to the table;
//! - `strict`: `require_live_lease` and `strict`; no zombie write is forwarded at all.
//!
//! Also on the record: per resource, forwarded tokens never go down (I1). The watch's lag (a
//! change acknowledged to its client → the gateway reflecting it) is reported.
//!
//! `service.rs`: what a lock service offers the history; `run.rs`: one mode's run and its record;
//! `etcd.rs`, `postgres.rs`, `zookeeper.rs`: the services, each with its test.

mod etcd;
mod postgres;
mod run;
mod service;
mod zookeeper;

use run::{run_mode, Mode, Report, ZOMBIE_WRITES};
use service::LockService;

/// Fewest zombie writes per mode: two pauses' worth.
const MIN_ZOMBIE_WRITES: usize = 2 * ZOMBIE_WRITES;

/// Runs the three modes on `S` one after another, prints what each counted, and checks them.
async fn zombie_history<S: LockService>(service: &str) {
    let mut reports = Vec::new();
    for mode in [Mode::Plain, Mode::Watch, Mode::Strict] {
        reports.push(run_mode::<S>(mode).await);
    }
    eprintln!("{}", table(service, &reports));
    for r in &reports {
        assert!(
            r.tried >= MIN_ZOMBIE_WRITES,
            "{service} {:?}: {} zombie writes, expected at least {MIN_ZOMBIE_WRITES}",
            r.mode,
            r.tried
        );
    }
    let [plain, watch, strict] = &reports[..] else {
        unreachable!("three modes")
    };
    assert!(
        plain.forwarded > 0,
        "{service}: plain fencing forwards zombies until the next holder writes"
    );
    assert!(
        watch.seen > 0,
        "{service}: the watch saw lease ends before zombies wrote"
    );
    assert_eq!(
        watch.seen_forwarded, 0,
        "{service} watch: a zombie write whose lease's end the gateway had seen was forwarded"
    );
    assert_eq!(
        strict.forwarded, 0,
        "{service} strict: a zombie write was forwarded"
    );
    assert!(
        watch.lag_ms.is_some(),
        "{service}: the watch's lag was measured"
    );
}

fn table(service: &str, reports: &[Report]) -> String {
    let mut out = format!("{service}\nmode    zombie writes: tried refused forwarded | seen by the watch (forwarded) | holder writes | watch lag ms (median, p99)\n");
    for r in reports {
        out.push_str(&format!(
            "{:<7} {:>26} {:>7} {:>9} | {:>17} ({}) | {:>13} | {}\n",
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
        ));
    }
    out
}
