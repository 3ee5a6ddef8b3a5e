//! One serving thread's keep-alive connections to plain-HTTP upstreams, on hyper's
//! connection-level HTTP/1.1 client: a connection is opened with a slot (`upstream_slots.rs`),
//! driven by a task on the serving thread, lent to one request at a time, and put back only once
//! its response's body has been read to the end. A request that a pooled connection closed before
//! sending goes out on another; a connection whose response was cut short is never lent again.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use tower::Service as _;

use super::upstream_slots::CappedConnector;
use super::{BoxError, RequestBody};

/// Why a request got no response from its upstream.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No connection could be opened (refused, timed out, or no free slot).
    #[error("connecting to the upstream failed: {0}")]
    Connect(#[source] BoxError),
    /// The request was (perhaps partly) sent, and the exchange failed.
    #[error("the upstream exchange failed: {0}")]
    Exchange(#[source] hyper::Error),
}

/// Idle connections kept for one upstream with when each was put back, newest last: lent newest
/// first, pruned oldest first.
type Idle = VecDeque<(http1::SendRequest<RequestBody>, Instant)>;

/// This thread's idle connections by upstream (`host:port`), and how to open more.
pub struct UpstreamPool {
    idle: Mutex<HashMap<String, Idle>>,
    connector: CappedConnector,
    max_idle_per_upstream: usize,
    idle_timeout: Duration,
}

impl UpstreamPool {
    pub fn new(
        connector: CappedConnector,
        max_idle_per_upstream: usize,
        idle_timeout: Duration,
    ) -> UpstreamPool {
        UpstreamPool {
            idle: Mutex::new(HashMap::new()),
            connector,
            max_idle_per_upstream,
            idle_timeout,
        }
    }

    /// Sends `request` (origin-form URI) to `upstream` (`host:port`, reached as `target`) on an
    /// idle connection, or a new one. The response's body hands its connection back at its end.
    pub async fn send(
        self: &Arc<Self>,
        upstream: &str,
        target: &Uri,
        mut request: Request<RequestBody>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        while let Some(mut sender) = self.take_idle(upstream) {
            // Idle connections wait for their next request; one still finishing its last exchange
            // is ready as soon as its task has run.
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.lend(upstream, sender, response)),
                Err(mut failed) => match failed.take_message() {
                    // Closed before a byte was sent (the upstream ended the idle connection):
                    // nothing reached it, so the request goes out on another connection.
                    Some(unsent) => request = unsent,
                    None => return Err(ForwardError::Exchange(failed.into_error())),
                },
            }
        }
        let io = self
            .connector
            .clone()
            .call(target.clone())
            .await
            .map_err(ForwardError::Connect)?;
        let (mut sender, connection) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| ForwardError::Connect(Box::new(e)))?;
        // Driven on this serving thread; it ends when the connection closes (the upstream or a
        // failure closes it, or every handle to it is dropped mid-exchange).
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "upstream connection ended with an error");
            }
        });
        let response = sender
            .send_request(request)
            .await
            .map_err(ForwardError::Exchange)?;
        Ok(self.lend(upstream, sender, response))
    }

    /// The newest idle connection to `upstream` that is open and not past the idle timeout.
    fn take_idle(&self, upstream: &str) -> Option<http1::SendRequest<RequestBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let connections = idle.get_mut(upstream)?;
        let now = Instant::now();
        while let Some((sender, since)) = connections.pop_back() {
            if !sender.is_closed() && now.duration_since(since) < self.idle_timeout {
                return Some(sender);
            }
        }
        None
    }

    /// Hands `sender` back once `response`'s body is read to its end (at once when it has none).
    fn lend(
        self: &Arc<Self>,
        upstream: &str,
        sender: http1::SendRequest<RequestBody>,
        response: Response<Incoming>,
    ) -> Response<PooledBody> {
        let back = (Arc::clone(self), upstream.to_owned(), sender);
        if response.body().is_end_stream() {
            let (pool, upstream, sender) = back;
            pool.put_back(upstream, sender);
            return response.map(|inner| PooledBody { inner, back: None });
        }
        response.map(|inner| PooledBody {
            inner,
            back: Some(back),
        })
    }

    fn put_back(&self, upstream: String, sender: http1::SendRequest<RequestBody>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let connections = idle.entry(upstream).or_default();
        // The oldest first: past the idle timeout, or closed by the upstream meanwhile. (A
        // closed one further in is dropped when it is taken.)
        while connections.front().is_some_and(|(sender, since)| {
            sender.is_closed() || now.duration_since(*since) >= self.idle_timeout
        }) {
            connections.pop_front();
        }
        if connections.len() < self.max_idle_per_upstream {
            connections.push_back((sender, now));
        }
    }
}

/// An upstream response's body, which returns its connection to the pool when read to the end.
/// Dropped before that, or failed, it drops the connection's handle instead: hyper then closes a
/// connection with an unread response rather than reuse it.
pub struct PooledBody {
    inner: Incoming,
    back: Option<(Arc<UpstreamPool>, String, http1::SendRequest<RequestBody>)>,
}

impl PooledBody {
    fn hand_back(&mut self) {
        if let Some((pool, upstream, sender)) = self.back.take() {
            pool.put_back(upstream, sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            // The end, or the last frame of a body whose length was known: the server stops
            // polling once `is_end_stream` says so.
            Poll::Ready(None) => self.hand_back(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.hand_back(),
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
