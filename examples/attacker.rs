//! The hostile clients of issue 18, run for as long as `benches/attacks.sh` needs them, and the
//! slow upstream some of them need. Each attack keeps itself going: what the gateway closes is
//! opened again, so the attack lasts until the process is killed.
//!
//! ```text
//! attacker upstream PORT DELAY_MS BYTES      # answers every request after DELAY_MS with BYTES bytes
//! attacker silent ADDR N                     # N connections that never send a byte
//! attacker h2-idle ADDR N                    # N HTTP/2 connections, handshake done, no stream
//! attacker h2-streams ADDR C S PATH          # C HTTP/2 connections, S concurrent requests each
//! attacker h2-bodies ADDR C S BYTES PATH     # the same, each request a fenced POST of BYTES bytes
//! attacker zero-window ADDR N PATH           # N HTTP/2 connections with a zero window, a fenced
//!                                            # PUT each whose answer is never read
//! attacker unread ADDR N PATH                # N HTTP/1.1 fenced PUTs whose answers are never read
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Pause before opening again what the gateway closed or refused.
const REOPEN_PAUSE: Duration = Duration::from_millis(20);

/// Tokens of the attackers' fenced writes: above anything the legitimate load sends.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1 << 40);

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| -> Result<&str, Failure> {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| format!("argument {i} missing; see the module docs").into())
    };
    let number = |i: usize| -> Result<usize, Failure> { Ok(arg(i)?.parse()?) };
    match arg(0)? {
        "upstream" => upstream(number(1)?, number(2)?, number(3)?).await,
        "silent" => forever(number(2)?, silent, arg(1)?.parse()?).await,
        "h2-idle" => forever(number(2)?, h2_idle, arg(1)?.parse()?).await,
        "h2-streams" => {
            let target = Streams::new(arg(1)?, number(3)?, arg(4)?, None)?;
            forever(number(2)?, h2_streams, target).await
        }
        "h2-bodies" => {
            let body = Bytes::from(vec![b'b'; number(4)?]);
            let target = Streams::new(arg(1)?, number(3)?, arg(5)?, Some(body))?;
            forever(number(2)?, h2_streams, target).await
        }
        "zero-window" => {
            let target = Streams::new(arg(1)?, 1, arg(3)?, None)?;
            forever(number(2)?, zero_window, target).await
        }
        "unread" => {
            let target = Streams::new(arg(1)?, 1, arg(3)?, None)?;
            forever(number(2)?, unread, target).await
        }
        other => Err(format!("unknown attack {other:?}; see the module docs").into()),
    }
}

/// Runs `count` copies of `attack`, each opened again whenever it ends.
async fn forever<T, F, Fut>(count: usize, attack: F, target: T) -> Result<(), Failure>
where
    T: Clone + Send + Sync + 'static,
    F: Fn(T) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), Failure>> + Send,
{
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let target = target.clone();
        tasks.spawn(async move {
            loop {
                let _ = attack(target.clone()).await;
                tokio::time::sleep(REOPEN_PAUSE).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// A connection that sends nothing and waits until the gateway closes it.
async fn silent(addr: SocketAddr) -> Result<(), Failure> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut sink = [0u8; 1024];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}

/// An HTTP/2 connection that completes its handshake and opens no stream.
async fn h2_idle(addr: SocketAddr) -> Result<(), Failure> {
    let stream = TcpStream::connect(addr).await?;
    let (_send, connection) = h2::client::handshake(stream).await?;
    connection.await?;
    Ok(())
}

/// Where a streams attack goes, and with what.
#[derive(Clone)]
struct Streams {
    addr: SocketAddr,
    per_connection: usize,
    path: Arc<str>,
    body: Option<Bytes>,
}

impl Streams {
    fn new(
        addr: &str,
        per_connection: usize,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Streams, Failure> {
        Ok(Streams {
            addr: addr.parse()?,
            per_connection,
            path: path.into(),
            body,
        })
    }

    fn request(&self, method: &str) -> Result<Request<()>, Failure> {
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed).to_string();
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{}", self.addr, self.path))
            .header("x-fence", token);
        if let Some(body) = &self.body {
            request = request.header("content-length", body.len());
        }
        Ok(request.body(())?)
    }
}

/// One HTTP/2 connection keeping `per_connection` requests in flight, each sent again when
/// answered.
async fn h2_streams(target: Streams) -> Result<(), Failure> {
    let stream = TcpStream::connect(target.addr).await?;
    let (send, connection) = h2::client::handshake(stream).await?;
    let driver = tokio::spawn(connection);
    let mut streams = tokio::task::JoinSet::new();
    for _ in 0..target.per_connection {
        let mut send = send.clone();
        let target = target.clone();
        streams.spawn(async move {
            loop {
                send = send.ready().await?;
                let method = if target.body.is_some() { "POST" } else { "PUT" };
                let end = target.body.is_none();
                let (answer, mut upload) = send.send_request(target.request(method)?, end)?;
                if let Some(body) = &target.body {
                    upload.send_data(body.clone(), true)?;
                }
                let mut body = answer.await?.into_body();
                while let Some(chunk) = body.data().await {
                    let chunk = chunk?;
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), Failure>(())
        });
    }
    while let Some(ended) = streams.join_next().await {
        if !matches!(ended, Ok(Ok(()))) {
            break;
        }
    }
    driver.abort();
    Ok(())
}

/// An HTTP/2 connection with a zero window: one fenced PUT whose answer can never arrive.
async fn zero_window(target: Streams) -> Result<(), Failure> {
    let stream = TcpStream::connect(target.addr).await?;
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(stream)
        .await?;
    let driver = tokio::spawn(connection);
    let mut send = send.ready().await?;
    let (answer, _) = send.send_request(target.request("PUT")?, true)?;
    let _head = answer.await?;
    // Holds the answer unread until the gateway closes the connection.
    let _ = driver.await;
    Ok(())
}

/// An HTTP/1.1 fenced PUT whose answer is never read past the socket's buffer.
async fn unread(target: Streams) -> Result<(), Failure> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(16 * 1024)?;
    let mut stream = socket.connect(target.addr).await?;
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let request = format!(
        "PUT {} HTTP/1.1\r\nHost: gateway\r\nX-Fence: {token}\r\nContent-Length: 0\r\n\r\n",
        target.path
    );
    stream.write_all(request.as_bytes()).await?;
    // Reads nothing; a peek (which takes no byte) notices when the gateway closed the
    // connection: a reset, or the end after the buffered bytes.
    let mut probe = [0u8; 1];
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match stream.peek(&mut probe).await {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => {}
        }
    }
}

/// A slow upstream: every request answered after `delay_ms` with `bytes` bytes.
async fn upstream(port: usize, delay_ms: usize, bytes: usize) -> Result<(), Failure> {
    let port = u16::try_from(port)?;
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let body = Bytes::from(vec![b'u'; bytes]);
    let delay = Duration::from_millis(u64::try_from(delay_ms)?);
    loop {
        let (stream, _) = listener.accept().await?;
        let body = body.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_request: Request<hyper::body::Incoming>| {
                let body = body.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    Ok::<_, Infallible>(Response::new(Full::new(body)))
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
