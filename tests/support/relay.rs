//! A TCP relay between the gateway and its store that a test can cut, stall, reset and restore —
//! store trouble without touching the machine's shared servers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMode {
    /// Bytes flow.
    Pass,
    /// Connections are held open but no byte moves (a stalled or partitioned server).
    Stall,
    /// Every connection is closed and new ones are closed at once (a server that is down).
    Cut,
    /// Requests still reach the server, but the connection is reset (RST, `SO_LINGER` 0) as the
    /// server's reply comes back: the operation may have happened, its answer is lost.
    Reset,
}

/// Why a relayed connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// EOF, an error, or a cut: both sides are closed.
    Closed,
    /// A reply arrived in `Reset` mode: both sides are reset.
    Reset,
}

pub struct Relay {
    pub addr: SocketAddr,
    mode: watch::Sender<RelayMode>,
    lost_replies: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let (mode, watcher) = watch::channel(RelayMode::Pass);
        let lost_replies = Arc::new(AtomicUsize::new(0));
        let lost = Arc::clone(&lost_replies);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let watcher = watcher.clone();
                let lost = Arc::clone(&lost);
                tokio::spawn(async move {
                    let mut client = client;
                    if *watcher.borrow() == RelayMode::Cut {
                        return;
                    }
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let end = {
                        let (client_read, client_write) = client.split();
                        let (server_read, server_write) = server.split();
                        tokio::select! {
                            end = pump(client_read, server_write, watcher.clone(), false) => end,
                            end = pump(server_read, client_write, watcher, true) => end,
                        }
                    };
                    if end == End::Reset {
                        lost.fetch_add(1, Ordering::SeqCst);
                        // Closing with a zero linger sends RST instead of FIN.
                        let _ = client.set_zero_linger();
                        let _ = server.set_zero_linger();
                    }
                });
            }
        });
        Relay {
            addr,
            mode,
            lost_replies,
            task,
        }
    }

    pub fn set(&self, mode: RelayMode) {
        self.mode.send_replace(mode);
    }

    /// Server replies dropped in Reset mode (each after the server had done what was asked).
    pub fn lost_replies(&self) -> usize {
        self.lost_replies.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        self.mode.send_replace(RelayMode::Cut);
    }
}

/// Copies one direction while the mode allows; ends (closing both sides) on Cut or EOF, and on a
/// server reply (`replies`) in Reset mode.
async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    mut mode: watch::Receiver<RelayMode>,
    replies: bool,
) -> End {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if !wait_for_pass(&mut mode).await {
            return End::Closed;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            changed = mode.changed() => {
                if changed.is_err() { return End::Closed; }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => return End::Closed,
            Ok(n) => n,
        };
        // Data read just before a stall is held until the relay passes again.
        if !wait_for_pass(&mut mode).await {
            return End::Closed;
        }
        if replies && *mode.borrow() == RelayMode::Reset {
            return End::Reset;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return End::Closed;
        }
    }
}

/// Waits while stalled; `false` when cut (Reset lets bytes through).
async fn wait_for_pass(mode: &mut watch::Receiver<RelayMode>) -> bool {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            RelayMode::Pass | RelayMode::Reset => return true,
            RelayMode::Cut => return false,
            RelayMode::Stall => {
                if mode.changed().await.is_err() {
                    return false;
                }
            }
        }
    }
}
