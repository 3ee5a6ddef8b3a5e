//! Raw HTTP/1.1 over a TCP socket: write exactly the given bytes, read the answer until the
//! gateway closes the connection. For requests a well-behaved client library would not send.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Longest a raw exchange may take before the test fails: the gateway must answer and close.
const EXCHANGE_BOUND: Duration = Duration::from_secs(20);

/// What came back on one raw connection.
#[derive(Debug)]
pub struct RawAnswer {
    pub bytes: Vec<u8>,
}

impl RawAnswer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The status codes of every response on the connection, in order.
    pub fn statuses(&self) -> Vec<u16> {
        let text = self.text();
        text.match_indices("HTTP/1.1 ")
            .filter_map(|(at, _)| text.get(at + 9..at + 12)?.parse().ok())
            .collect()
    }

    /// The status of the first response.
    pub fn status(&self) -> Option<u16> {
        self.statuses().first().copied()
    }
}

/// Writes `request` to a fresh connection and reads until the peer closes it (or resets it after
/// answering). Panics if nothing ends the exchange within a generous bound.
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> RawAnswer {
    let run = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect to gateway");
        // The gateway may answer and close before reading everything; a failed write is fine.
        let _ = stream.write_all(request).await;
        let mut bytes = Vec::new();
        let mut buffer = [0u8; 8192];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buffer[..n]),
            }
        }
        RawAnswer { bytes }
    };
    tokio::time::timeout(EXCHANGE_BOUND, run)
        .await
        .expect("the gateway neither answered nor closed the connection")
}
