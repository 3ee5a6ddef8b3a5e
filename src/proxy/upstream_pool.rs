//! One serving thread's keep-alive connections to upstreams, on hyper's connection-level
//! clients: a connection is opened by the pool's dialer (`upstream_dial.rs`, with a slot, over
//! TCP or TLS), and driven by a task on the serving thread. An HTTP/1.1 connection is lent to one
//! request at a time and put back only once its response's body has been read to the end; an
//! HTTP/2 one (agreed by ALPN) is shared by every request while it stays open. A request that a
//! pooled connection closed before sending goes out on another; a connection whose HTTP/1.1
//! response was cut short is never lent again.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Parts, PathAndQuery};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};

use super::upstream_dial::{Dialer, Opened};
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

/// This thread's connections by upstream (`host:port`), and how to open more.
pub struct UpstreamPool {
    idle: Mutex<HashMap<String, Idle>>,
    /// One HTTP/2 connection per upstream, for as long as it stays open.
    shared: Mutex<HashMap<String, http2::SendRequest<RequestBody>>>,
    dialer: Dialer,
    max_idle_per_upstream: usize,
    idle_timeout: Duration,
}

impl UpstreamPool {
    pub fn new(
        dialer: Dialer,
        max_idle_per_upstream: usize,
        idle_timeout: Duration,
    ) -> UpstreamPool {
        UpstreamPool {
            idle: Mutex::new(HashMap::new()),
            shared: Mutex::new(HashMap::new()),
            dialer,
            max_idle_per_upstream,
            idle_timeout,
        }
    }

    /// Sends `request` (origin-form URI) to `upstream` (`host:port`, reached as `target`,
    /// `scheme://host:port/`) on a pooled connection, or a new one. An HTTP/1.1 response's body
    /// hands its connection back at its end.
    pub async fn send(
        self: &Arc<Self>,
        upstream: &str,
        target: &Uri,
        mut request: Request<RequestBody>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        if let Some(mut shared) = self.take_shared(upstream) {
            match send_h2(&mut shared, target, request).await {
                Ok(response) => return Ok(unpooled(response)),
                // Back from an HTTP/2 connection that closed first: origin form again.
                Err(Unsent::Again(unsent)) => {
                    request = *unsent;
                    *request.uri_mut() = origin_form(request.uri());
                }
                Err(Unsent::Failed(error)) => return Err(ForwardError::Exchange(error)),
            }
        }
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
        // Boxed: opening a connection (TCP, TLS, handshake) is a large future, and kept inline
        // it would be copied with every request's future although few requests open one.
        match Box::pin(self.dialer.open(target))
            .await
            .map_err(ForwardError::Connect)?
        {
            Opened::Http1(mut sender) => {
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(ForwardError::Exchange)?;
                Ok(self.lend(upstream, sender, response))
            }
            Opened::Http2(mut sender) => {
                self.share(upstream, sender.clone());
                match send_h2(&mut sender, target, request).await {
                    Ok(response) => Ok(unpooled(response)),
                    Err(Unsent::Again(_)) => Err(ForwardError::Connect(
                        "the new HTTP/2 connection closed before the request was sent".into(),
                    )),
                    Err(Unsent::Failed(error)) => Err(ForwardError::Exchange(error)),
                }
            }
        }
    }

    /// `upstream`'s HTTP/2 connection, while it is open. (None without a lock where the dialer
    /// never agrees HTTP/2: plain upstreams.)
    fn take_shared(&self, upstream: &str) -> Option<http2::SendRequest<RequestBody>> {
        if !self.dialer.may_agree_http2() {
            return None;
        }
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        match shared.get(upstream) {
            Some(sender) if !sender.is_closed() => Some(sender.clone()),
            Some(_) => {
                shared.remove(upstream);
                None
            }
            None => None,
        }
    }

    /// Makes `sender` the HTTP/2 connection later requests to `upstream` share (one opened at
    /// the same time by another request serves that request only, and closes after it).
    fn share(&self, upstream: &str, sender: http2::SendRequest<RequestBody>) {
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if shared.get(upstream).is_none_or(|open| open.is_closed()) {
            shared.insert(upstream.to_owned(), sender);
        }
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

/// Why a request went unanswered on an HTTP/2 connection.
enum Unsent {
    /// The connection closed before the request was sent: it may go out on another. (Boxed:
    /// rare, and the request is large.)
    Again(Box<Request<RequestBody>>),
    Failed(hyper::Error),
}

/// Sends `request` on a stream of `sender`'s connection. HTTP/2 carries the scheme and authority
/// (`:scheme`, `:authority`), so the origin-form URI is made absolute against `target`.
async fn send_h2(
    sender: &mut http2::SendRequest<RequestBody>,
    target: &Uri,
    mut request: Request<RequestBody>,
) -> Result<Response<Incoming>, Unsent> {
    *request.uri_mut() = absolute(target, request.uri());
    if sender.ready().await.is_err() {
        return Err(Unsent::Again(Box::new(request)));
    }
    match sender.try_send_request(request).await {
        Ok(response) => Ok(response),
        Err(mut failed) => match failed.take_message() {
            Some(unsent) => Err(Unsent::Again(Box::new(unsent))),
            None => Err(Unsent::Failed(failed.into_error())),
        },
    }
}

/// `origin`'s path and query below `target`'s scheme and authority.
fn absolute(target: &Uri, origin: &Uri) -> Uri {
    let mut parts = Parts::default();
    parts.scheme = target.scheme().cloned();
    parts.authority = target.authority().cloned();
    parts.path_and_query = Some(
        origin
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    Uri::from_parts(parts).unwrap_or_else(|_| origin.clone())
}

/// `uri`'s path and query alone: what an HTTP/1.1 request line carries.
fn origin_form(uri: &Uri) -> Uri {
    let mut parts = Parts::default();
    parts.path_and_query = uri.path_and_query().cloned();
    Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"))
}

/// A response whose connection needs no hand-back (an HTTP/2 stream's).
fn unpooled(response: Response<Incoming>) -> Response<PooledBody> {
    response.map(|inner| PooledBody { inner, back: None })
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
