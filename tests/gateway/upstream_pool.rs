//! The serving threads' pools of upstream connections: kept alive and lent again, never lent
//! while a response is unread, and a connection the upstream closed between two requests costs
//! a new connection, not a 502 and not a second copy of the request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::support::TestGateway;

/// A raw HTTP/1.1 upstream: answers every request `200 ok` (bodies are ignored: the tests send
/// none) and counts connections and requests. With `close_after_each`, it closes the connection
/// right after each answer without saying so, as an upstream whose idle timeout is tiny does.
struct CountingUpstream {
    url: String,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl CountingUpstream {
    async fn start(close_after_each: bool) -> CountingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (c, r) = (Arc::clone(&connections), Arc::clone(&requests));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, Arc::clone(&r), close_after_each));
            }
        });
        CountingUpstream {
            url,
            connections,
            requests,
        }
    }
}

async fn serve(mut stream: TcpStream, requests: Arc<AtomicUsize>, close_after_each: bool) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            buffer.drain(..end + 4);
            requests.fetch_add(1, Ordering::SeqCst);
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            if stream.write_all(answer).await.is_err() {
                return;
            }
            if close_after_each {
                // The answer is out; the close follows a moment later, when the gateway may
                // already have put the connection back in its pool.
                tokio::time::sleep(Duration::from_millis(5)).await;
                return;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

fn plain_route(upstream: &str) -> String {
    format!(
        "[[routes]]\nname = \"plain\"\npath = \"/plain/{{id}}\"\nupstream = \"{upstream}\"\n\n[routes.fence]\nmode = \"off\"\n"
    )
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_lent_again() {
    let upstream = CountingUpstream::start(false).await;
    let gw = TestGateway::start(&plain_route(&upstream.url)).await;
    for i in 0..40 {
        let reply = crate::support::send("GET", &gw.url(&format!("/plain/{i}")), &[], "").await;
        assert_eq!(reply.status, 200, "{i}: {:?}", reply.body);
        assert_eq!(&reply.body[..], b"ok");
    }
    assert_eq!(upstream.requests.load(Ordering::SeqCst), 40);
    // One connection per serving thread at most: one request at a time never needs a second.
    let opened = upstream.connections.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&opened),
        "40 requests one after another opened {opened} upstream connections"
    );
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_replaced_without_a_502_or_a_repeat() {
    let upstream = CountingUpstream::start(true).await;
    let gw = TestGateway::start(&plain_route(&upstream.url)).await;
    for i in 0..40 {
        let reply = crate::support::send("GET", &gw.url(&format!("/plain/{i}")), &[], "").await;
        assert_eq!(reply.status, 200, "{i}: {:?}", reply.body);
        // Sometimes the close lands while the connection sits idle in the pool, sometimes
        // after the next request took it.
        if i % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Each request reached the upstream exactly once, each on a connection of its own.
    assert_eq!(upstream.requests.load(Ordering::SeqCst), 40);
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 40);
}
