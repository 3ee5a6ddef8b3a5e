//! One serving thread's keep-alive connections to upstreams: a connection is opened by the pool's
//! dialer (`upstream_dial.rs`, with a slot, over TCP or TLS). An HTTP/1.1 connection is the
//! gateway's own client (`h1/`), driven by the request that holds it, lent to one request at a
//! time and put back only once its response's body has been read to the end; an HTTP/2 one
//! (agreed by ALPN) is hyper's, driven by a task on the serving thread and shared by every request
//! while it stays open. A pooled connection the upstream has closed is dropped before a request
//! is written to it; one whose HTTP/1.1 response was cut short is never lent again.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Weak;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Parts, PathAndQuery};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2;

use super::h1::{H1Body, H1Connection};
use super::upstream_dial::{Dialer, Opened};
use crate::body::{BoxError, RequestBody};

/// Why a request got no response from its upstream.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No connection could be opened (refused, timed out, or no free slot).
    #[error("connecting to the upstream failed: {0}")]
    Connect(#[source] BoxError),
    /// The request was (perhaps partly) sent, and the exchange failed.
    #[error("the upstream exchange failed: {0}")]
    Exchange(#[source] BoxError),
}

/// Idle connections kept for one upstream with when each was put back, newest last: lent newest
/// first, pruned oldest first.
type Idle = VecDeque<(H1Connection, Instant)>;

/// The pools' maps are keyed by configured upstreams (`host:port`), never by client input, and
/// looked up twice per forwarded request: a fast hash rather than SipHash.
type FastHash = foldhash::fast::RandomState;

/// This thread's connections by upstream (`host:port`), and how to open more.
pub struct UpstreamPool {
    idle: Mutex<HashMap<Arc<str>, Idle, FastHash>>,
    /// One HTTP/2 connection per upstream, for as long as it stays open.
    shared: Mutex<HashMap<Arc<str>, http2::SendRequest<RequestBody>, FastHash>>,
    dialer: Dialer,
    max_idle_per_upstream: usize,
    idle_timeout: Duration,
    /// HTTP/1.1 exchanges of this thread between taking a connection and their response head.
    waiting: AtomicUsize,
    /// Whether the task that drops idle connections the upstream closed has been started.
    sweeping: AtomicBool,
}

impl UpstreamPool {
    pub fn new(
        dialer: Dialer,
        max_idle_per_upstream: usize,
        idle_timeout: Duration,
    ) -> UpstreamPool {
        UpstreamPool {
            idle: Mutex::new(HashMap::default()),
            shared: Mutex::new(HashMap::default()),
            dialer,
            max_idle_per_upstream,
            idle_timeout,
            waiting: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
        }
    }

    /// Sends `request` (origin-form URI) to `upstream` (`host:port`, reached as `target`,
    /// `scheme://host:port/`) on a pooled connection, or a new one. An HTTP/1.1 response's body
    /// hands its connection back at its end.
    pub async fn send(
        self: &Arc<Self>,
        upstream: &Arc<str>,
        target: &Uri,
        mut request: Request<RequestBody>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        if let Some(mut shared) = self.take_shared(upstream) {
            // Boxed, here and below: an HTTP/2 exchange's future is large (about 2 KiB), and kept
            // inline it would be copied with every request's future, HTTP/1.1 ones included.
            match Box::pin(send_h2(&mut shared, target, request)).await {
                Ok(response) => return Ok(unpooled(response)),
                // Back from an HTTP/2 connection that closed first: origin form again.
                Err(Unsent::Again(unsent)) => {
                    request = *unsent;
                    *request.uri_mut() = origin_form(request.uri());
                }
                Err(Unsent::Failed(error)) => return Err(ForwardError::Exchange(Box::new(error))),
            }
        }
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            // On this serving thread, where the pool's connections live.
            tokio::spawn(sweep_idle(Arc::downgrade(self)));
        }
        let others_waiting = Waiting::enter(&self.waiting);
        if others_waiting.before > 0 {
            // While this thread has other exchanges waiting for their answers, this request is
            // written once the thread next polls for I/O rather than at once, so that the writes
            // of one turn of the thread go out together and wake the upstream once per batch. On
            // loopback (2 cores shared with wrk and nginx, c=128, medians of 3 alternating
            // rounds): 66.8k req/s and 9.2 µs of kernel CPU per request writing at once, 74.1k
            // and 7.7 µs deferred (hyper's client, whose connection task wrote later in the turn,
            // 72.7k and 7.5 µs). A lone request is written at once: deferring it too cost 8 µs of
            // p50 at c=1.
            tokio::task::yield_now().await;
        }
        let connection = match self.take_idle(upstream) {
            Some(connection) => connection,
            // Boxed: opening a connection (TCP, TLS, handshake) is a large future, and kept inline
            // it would be copied with every request's future although few requests open one.
            None => match Box::pin(self.dialer.open(target))
                .await
                .map_err(ForwardError::Connect)?
            {
                Opened::Http1(connection) => connection,
                Opened::Http2(sender) => {
                    return Box::pin(self.send_on_new_h2(upstream, sender, target, request)).await
                }
            },
        };
        // One await for a pooled and a new connection alike: the exchange's future is held in
        // one place of this future, not two.
        let response = connection.send(request).await.map_err(exchange_failed)?;
        Ok(self.lend(upstream, response))
    }

    /// Sends `request` on a new HTTP/2 connection to `upstream`, which later requests share.
    async fn send_on_new_h2(
        &self,
        upstream: &Arc<str>,
        mut sender: http2::SendRequest<RequestBody>,
        target: &Uri,
        request: Request<RequestBody>,
    ) -> Result<Response<PooledBody>, ForwardError> {
        self.share(upstream, sender.clone());
        match send_h2(&mut sender, target, request).await {
            Ok(response) => Ok(unpooled(response)),
            Err(Unsent::Again(_)) => Err(ForwardError::Connect(
                "the new HTTP/2 connection closed before the request was sent".into(),
            )),
            Err(Unsent::Failed(error)) => Err(ForwardError::Exchange(Box::new(error))),
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
    fn share(&self, upstream: &Arc<str>, sender: http2::SendRequest<RequestBody>) {
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if shared.get(upstream).is_none_or(|open| open.is_closed()) {
            shared.insert(Arc::clone(upstream), sender);
        }
    }

    /// The newest idle connection to `upstream` that is open and not past the idle timeout.
    fn take_idle(&self, upstream: &str) -> Option<H1Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let connections = idle.get_mut(upstream)?;
        let now = Instant::now();
        while let Some((mut connection, since)) = connections.pop_back() {
            if now.duration_since(since) < self.idle_timeout && !connection.is_closed() {
                return Some(connection);
            }
        }
        None
    }

    /// Hands the connection back once `response`'s body is read to its end (at once when it has
    /// none).
    fn lend(
        self: &Arc<Self>,
        upstream: &Arc<str>,
        response: Response<H1Body>,
    ) -> Response<PooledBody> {
        let mut response = response.map(|body| PooledBody {
            inner: Inner::Http1(body),
            back: None,
        });
        if !response.body_mut().hand_back_if_ended(self, upstream) {
            response.body_mut().back = Some((Arc::clone(self), Arc::clone(upstream)));
        }
        response
    }

    /// Drops idle connections past the idle timeout or closed by their upstream, so that their
    /// sockets close and their slots (shared by every serving thread) come free.
    fn sweep(&self) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        for connections in idle.values_mut() {
            connections.retain_mut(|(connection, since)| {
                now.duration_since(*since) < self.idle_timeout && !connection.is_closed()
            });
        }
        idle.retain(|_, connections| !connections.is_empty());
    }

    fn put_back(&self, upstream: Arc<str>, connection: H1Connection) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let connections = idle.entry(upstream).or_default();
        // The oldest first, past the idle timeout. (One the upstream closed meanwhile is dropped
        // when it is taken.)
        while connections
            .front()
            .is_some_and(|(_, since)| now.duration_since(*since) >= self.idle_timeout)
        {
            connections.pop_front();
        }
        if connections.len() < self.max_idle_per_upstream {
            connections.push_back((connection, now));
        }
    }
}

/// How often a pool looks for idle connections their upstream closed.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Sweeps `pool`'s idle connections every [`SWEEP_EVERY`] for as long as the pool lives: without
/// it, a connection the upstream closed would keep its socket and its slot until this thread
/// next sent a request to that upstream, while other threads wait for slots.
async fn sweep_idle(pool: Weak<UpstreamPool>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        pool.sweep();
    }
}

/// One exchange counted in a pool's `waiting` for as long as it lives.
struct Waiting<'a> {
    count: &'a AtomicUsize,
    /// How many were waiting when it entered.
    before: usize,
}

impl Waiting<'_> {
    fn enter(count: &AtomicUsize) -> Waiting<'_> {
        let before = count.fetch_add(1, Ordering::Relaxed);
        Waiting { count, before }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
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
    response.map(|body| PooledBody {
        inner: Inner::Http2(body),
        back: None,
    })
}

fn exchange_failed(error: super::h1::H1Error) -> ForwardError {
    ForwardError::Exchange(Box::new(error))
}

/// An upstream response's body. An HTTP/1.1 one returns its connection to the pool when read to
/// the end; dropped before that, or failed, it closes the connection.
pub struct PooledBody {
    inner: Inner,
    back: Option<(Arc<UpstreamPool>, Arc<str>)>,
}

enum Inner {
    Http1(H1Body),
    Http2(Incoming),
}

impl PooledBody {
    /// Puts the connection back in `pool` if the body has ended and the connection may be
    /// reused; whether the body has ended.
    fn hand_back_if_ended(&mut self, pool: &UpstreamPool, upstream: &Arc<str>) -> bool {
        let Inner::Http1(body) = &mut self.inner else {
            return true;
        };
        if !body.is_end_stream() {
            return false;
        }
        if let Some(connection) = body.take_reusable() {
            pool.put_back(Arc::clone(upstream), connection);
        }
        true
    }

    fn on_end(&mut self) {
        if let (Inner::Http1(body), Some((pool, upstream))) = (&mut self.inner, self.back.take()) {
            if let Some(connection) = body.take_reusable() {
                pool.put_back(upstream, connection);
            }
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled: Poll<Option<Result<Frame<Bytes>, BoxError>>> = match &mut self.inner {
            Inner::Http1(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
            Inner::Http2(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
        };
        match &polled {
            // The end, or the last frame of a body whose length was known: the server stops
            // polling once `is_end_stream` says so.
            Poll::Ready(None) => self.on_end(),
            Poll::Ready(Some(Ok(_))) if self.is_end_stream() => self.on_end(),
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Http1(body) => body.is_end_stream(),
            Inner::Http2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Http1(body) => body.size_hint(),
            Inner::Http2(body) => body.size_hint(),
        }
    }
}
