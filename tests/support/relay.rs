//! A TCP relay between the gateway and its store that a test can cut, stall and restore — store
//! trouble without touching the machine's shared servers.

use std::net::SocketAddr;

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
}

pub struct Relay {
    pub addr: SocketAddr,
    mode: watch::Sender<RelayMode>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let (mode, watcher) = watch::channel(RelayMode::Pass);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let watcher = watcher.clone();
                tokio::spawn(async move {
                    if *watcher.borrow() == RelayMode::Cut {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::select! {
                        () = pump(client_read, server_write, watcher.clone()) => {}
                        () = pump(server_read, client_write, watcher) => {}
                    }
                });
            }
        });
        Relay { addr, mode, task }
    }

    pub fn set(&self, mode: RelayMode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        self.mode.send_replace(RelayMode::Cut);
    }
}

/// Copies one direction while the mode allows; returns (closing both sides) on Cut or EOF.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<RelayMode>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if !wait_for_pass(&mut mode).await {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            changed = mode.changed() => {
                if changed.is_err() { return; }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Data read just before a stall is held until the relay passes again.
        if !wait_for_pass(&mut mode).await || to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits while stalled; `false` when cut.
async fn wait_for_pass(mode: &mut watch::Receiver<RelayMode>) -> bool {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            RelayMode::Pass => return true,
            RelayMode::Cut => return false,
            RelayMode::Stall => {
                if mode.changed().await.is_err() {
                    return false;
                }
            }
        }
    }
}
