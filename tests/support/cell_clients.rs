//! The clients of one fault-matrix cell: where the gateway is now, a sequence number per request
//! (sent as `x-seq`, so the upstream's record names it), what every request got, and writers
//! that send rising tokens on one key until told to stop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::Rng as _;

use super::fault_checks::{Role, Sent};
use super::outcome::{exchange, Outcome};

/// Writers per key; their tokens interleave (`step * WRITERS_PER_KEY + lane`), so they race.
pub const WRITERS_PER_KEY: u64 = 2;
/// A writer's last step: its tokens stay below `(MAX_STEPS + 1) * WRITERS_PER_KEY`.
pub const MAX_STEPS: u64 = 5_000;

/// What the clients of one cell share: where the gateway is, and what every request got.
pub struct Clients {
    /// The gateway's base URL (it changes when a killed gateway is restarted).
    pub base: RwLock<String>,
    next_seq: AtomicU64,
    sent: Mutex<Vec<Sent>>,
    /// Tells the writers to stop after their current request.
    pub stop: AtomicBool,
}

impl Clients {
    pub fn new(base: String) -> Clients {
        Clients {
            base: RwLock::new(base),
            next_seq: AtomicU64::new(1),
            sent: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }
    }

    /// POSTs `token` to `/w/{key}` and records what came of it.
    pub async fn send(&self, key: u64, token: u64, role: Role) -> Outcome {
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let url = format!("{}/w/{key}", self.base.read().expect("base lock").as_str());
        let sent = Instant::now();
        let headers = [("x-fence", token.to_string()), ("x-seq", seq.to_string())];
        let outcome = exchange("POST", &url, &headers).await;
        self.sent.lock().expect("sent lock").push(Sent {
            seq,
            key,
            token,
            role,
            sent,
            answered: Instant::now(),
            outcome: outcome.clone(),
        });
        outcome
    }

    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().expect("sent lock").clone()
    }
}

/// One writer: rising tokens on one key, interleaved with the other writer of the key.
pub async fn writer(clients: Arc<Clients>, key: u64, lane: u64) {
    for step in 1..=MAX_STEPS {
        if clients.stop.load(Ordering::SeqCst) {
            return;
        }
        let outcome = clients
            .send(key, step * WRITERS_PER_KEY + lane, Role::Workload)
            .await;
        // Back off a little after a failure, so a fault does not burn through the steps.
        let pause = match outcome.status() {
            Some(200 | 409) => rand::thread_rng().gen_range(0..10),
            _ => 30,
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}
