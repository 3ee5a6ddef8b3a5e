//! hyper's own HTTP/1 server as the reference the gateway's HTTP/1 pieces are checked against
//! (tests/gateway/request_heads.rs, request_bodies.rs, response_heads.rs, response_bodies.rs):
//! one connection served as the gateway's listener serves it, and a client's view of the answer.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The gateway's default `[server] max_header_bytes`, hyper's read-buffer limit in its listener.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How long a connection may stay silent before its answer counts as whole (and the connection
/// as kept open).
const QUIET: Duration = Duration::from_millis(300);

/// Serves the first connection to the returned address with hyper's auto builder (HTTP/1 head
/// limit as the gateway's), answering every request with `answer`.
pub async fn serve_one<F, Fut, B>(answer: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let answered = answer(request);
            async move { Ok::<_, Infallible>(answered.await) }
        });
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().max_buf_size(MAX_HEAD_BYTES);
        let _ = builder
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
    addr
}

/// Sends `raw` on a new connection to `addr`; everything received until the connection closed or
/// went quiet, and whether it closed.
pub async fn send_until_quiet(addr: SocketAddr, raw: &[u8]) -> (Vec<u8>, bool) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(raw).await.expect("write");
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout(QUIET, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (received, true),
            Ok(Ok(read)) => received.extend_from_slice(&buffer[..read]),
            Err(_) => return (received, false),
        }
    }
}

/// The value of the `date` field in `answer`'s head (empty if it has none).
pub fn date_field(answer: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(answer)
        .lines()
        .take_while(|line| !line.is_empty())
        .find_map(|line| line.strip_prefix("date: "))
        .unwrap_or_default()
        .as_bytes()
        .to_vec()
}
