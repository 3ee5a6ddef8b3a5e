//! A rolling restart of two replicas behind a load balancer that health-checks each replica's
//! `/readyz` (HAProxy from Debian, without retries, as a plain balancer is): under steady load
//! from several clients, each replica in turn is sent SIGTERM, drains and is started again on the
//! same addresses, and not one request fails. With `drain_delay = "0s"` the same run loses
//! requests (the listener closes before the balancer has seen the replica go), which is what the
//! delay is for.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::client::{answers_within, try_send};
use crate::support::gateway::fenced_route;
use crate::support::process::{free_port, Launch};
use crate::support::{Behavior, GatewayProcess, RecordingUpstream};

const TOKEN: &str = "rolling-restart-token-0123456789";
/// Clients sending requests through the balancer for the whole run.
const CLIENTS: usize = 4;

/// HAProxy in the foreground, stopped when dropped.
struct Balancer {
    child: Child,
    _config: tempfile::NamedTempFile,
}

impl Balancer {
    /// Balances `listen` over `replicas` (data plane, admin), checking each one's `/readyz` every
    /// 100 ms: one failed check takes a replica out, one passed check brings it back.
    fn start(listen: SocketAddr, replicas: &[(SocketAddr, SocketAddr)]) -> Balancer {
        assert!(
            Command::new("haproxy")
                .arg("-v")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            "this test needs haproxy (Debian package haproxy; tests/upstreams/install.sh installs it)"
        );
        let servers: String = replicas
            .iter()
            .enumerate()
            .map(|(i, (data, admin))| {
                format!(
                    "  server r{i} {data} check port {} inter 100ms fall 1 rise 1\n",
                    admin.port()
                )
            })
            .collect();
        let config = tempfile::NamedTempFile::new().expect("haproxy config file");
        std::fs::write(
            config.path(),
            format!(
                "global\n  nbthread 1\ndefaults\n  mode http\n  retries 0\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\nfrontend clients\n  bind {listen}\n  default_backend replicas\nbackend replicas\n  option httpchk GET /readyz\n{servers}"
            ),
        )
        .expect("write haproxy config");
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(config.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy");
        Balancer {
            child,
            _config: config,
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the clients saw: requests answered 2xx, and every other outcome.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    failed: Mutex<Vec<String>>,
}

/// Runs the rolling restart with `drain_delay` and returns what the clients saw.
async fn rolling_restart(drain_delay: &str) -> Arc<Tally> {
    let upstream = RecordingUpstream::start(Behavior::Ok).await;
    let route = fenced_route("docs", &upstream.url(), "enforce", "monotonic");
    let dirs = [
        tempfile::tempdir().expect("temp dir"),
        tempfile::tempdir().expect("temp dir"),
    ];
    let addresses = [(free_port(), free_port()), (free_port(), free_port())];
    let launch = |i: usize| {
        let (data, admin) = addresses[i];
        Launch::new()
            .server(&format!("drain_delay = \"{drain_delay}\""))
            .admin(TOKEN, "")
            .at(data, admin)
            .start(dirs[i].path(), &route)
    };
    let readyz = |i: usize| format!("http://{}/readyz", addresses[i].1);
    let mut replicas: Vec<Option<GatewayProcess>> = vec![Some(launch(0)), Some(launch(1))];
    for i in 0..2 {
        assert!(
            answers_within(&readyz(i), 200, Duration::from_secs(10)).await,
            "replica {i} never ready"
        );
    }
    let front = free_port();
    let _balancer = Balancer::start(front, &addresses);
    let through = format!("http://{front}/docs/1");
    assert!(
        answers_within(&through, 200, Duration::from_secs(10)).await,
        "the balancer never answered"
    );
    // Both replicas in: the balancer has checked each at least once.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (tally, stop, url) = (Arc::clone(&tally), Arc::clone(&stop), through.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let seen = match try_send("GET", &url, &[], "").await {
                        Ok(reply) if reply.status.is_success() => {
                            tally.ok.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Ok(reply) => {
                            format!("{} {}", reply.status, String::from_utf8_lossy(&reply.body))
                        }
                        Err(error) => format!("no answer: {error}"),
                    };
                    tally.failed.lock().expect("tally").push(seen);
                }
            })
        })
        .collect();

    for (i, replica) in replicas.iter_mut().enumerate() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let leaving = replica.take().expect("a running replica");
        leaving.signal_terminate();
        let status =
            tokio::task::spawn_blocking(move || leaving.wait_exit(Duration::from_secs(30)))
                .await
                .expect("wait task");
        assert_eq!(status.code(), Some(0), "replica {i}: {status}");
        *replica = Some(launch(i));
        assert!(
            answers_within(&readyz(i), 200, Duration::from_secs(10)).await,
            "replica {i} not ready after its restart"
        );
        // The balancer brings it back at its next check (every 100 ms): ten checks' margin
        // before the other replica leaves.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("client task");
    }
    tally
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_behind_a_readyz_checking_balancer_fails_no_request() {
    let tally = rolling_restart("2s").await;
    let failed = tally.failed.lock().expect("tally").clone();
    let ok = tally.ok.load(Ordering::Relaxed);
    assert!(ok > 200, "only {ok} requests were answered during the run");
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the rolling restart, e.g. {:?}",
        failed.len(),
        failed.len() + ok,
        failed.first()
    );
}
