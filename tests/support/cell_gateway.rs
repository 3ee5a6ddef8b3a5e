//! The gateway of one fault-matrix cell: in process (its store read directly), or the real binary
//! with an admin listener (its store read through the admin API), which can be killed with
//! `kill -9` and started again on the same store.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::outcome::{exchange, Outcome};
use super::{GatewayProcess, TestGateway};

/// The admin API's bearer token in the binary's configuration.
const ADMIN_TOKEN: &str = "fault-matrix-admin-token";

/// The gateway under test: in process for store and upstream faults, the real binary (with an
/// admin listener to read marks) for `kill -9`.
pub enum Gateway {
    InProcess(TestGateway),
    Process {
        process: GatewayProcess,
        admin: SocketAddr,
    },
    /// Killed, not yet restarted.
    Down,
}

impl Gateway {
    /// Starts the binary with `route` (whole `[[routes]]` tables) and an admin listener.
    pub async fn start_process(dir: &Path, store: &str, route: &str) -> Gateway {
        let admin = super::process::free_port();
        let routes = format!("{route}[admin]\nlisten = \"{admin}\"\ntoken = \"{ADMIN_TOKEN}\"\n");
        let (dir, store): (PathBuf, String) = (dir.to_owned(), store.to_owned());
        let process = tokio::task::spawn_blocking(move || {
            GatewayProcess::start_with_store(&dir, &store, &routes)
        })
        .await
        .expect("start the binary");
        Gateway::Process { process, admin }
    }

    /// The data plane's base URL.
    pub fn base(&self) -> String {
        match self {
            Gateway::InProcess(gw) => gw.url(""),
            Gateway::Process { process, .. } => process.url(""),
            Gateway::Down => unreachable!("the gateway is restarted before it is used again"),
        }
    }

    /// The mark of `w:{key}` as the store has it; `Err` while the store does not answer.
    pub async fn mark(&self, key: u64) -> Result<Option<u64>, String> {
        let name = format!("w:{key}");
        match self {
            Gateway::InProcess(gw) => gw.store().current(&name).await.map_err(|e| e.to_string()),
            Gateway::Process { admin, .. } => {
                let url = format!("http://{admin}/admin/fences/{name}");
                let auth = [("authorization", format!("Bearer {ADMIN_TOKEN}"))];
                match exchange("GET", &url, &auth).await {
                    Outcome::Answered(answer) if answer.status == 200 => {
                        let json: serde_json::Value =
                            serde_json::from_slice(&answer.body).expect("admin JSON");
                        Ok(Some(
                            json["fence"].as_u64().expect("fence in the admin answer"),
                        ))
                    }
                    Outcome::Answered(answer) if answer.status == 404 => Ok(None),
                    other => Err(format!("admin read of {name}: {other:?}")),
                }
            }
            Gateway::Down => unreachable!("the gateway is restarted before it is used again"),
        }
    }

    /// The marks of `keys`, read again while the store is still coming back, until `bound`.
    pub async fn marks(
        &self,
        keys: impl Iterator<Item = u64> + Clone,
        bound: Duration,
    ) -> HashMap<u64, Option<u64>> {
        let deadline = Instant::now() + bound;
        loop {
            let mut marks = HashMap::new();
            let mut failed = None;
            for key in keys.clone() {
                match self.mark(key).await {
                    Ok(mark) => {
                        marks.insert(key, mark);
                    }
                    Err(e) => failed = Some(e),
                }
            }
            match failed {
                None => return marks,
                Some(e) => assert!(Instant::now() < deadline, "marks unreadable: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
