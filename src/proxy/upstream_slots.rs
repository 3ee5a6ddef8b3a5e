//! The cap on open connections to each upstream (`max_upstream_connections`), for the whole
//! process: a connection to an upstream is opened only with one of its slots, held until the
//! connection closes, so no number of client connections or HTTP/2 streams can open more. A
//! request that finds no idle pooled connection and no free slot within
//! `upstream_connection_wait` is answered 503 `upstream-busy`.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use dashmap::DashMap;
use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::Service;

use crate::body::BoxError;
use crate::config::{RouteConfig, ServerConfig};
use crate::route::UpstreamTarget;

/// No slot to the upstream came free within the wait.
#[derive(Debug, thiserror::Error)]
#[error("all {cap} connections to upstream {upstream} stayed busy for {wait:?}")]
pub struct UpstreamBusy {
    pub upstream: String,
    pub cap: usize,
    pub wait: Duration,
}

/// The slots of every upstream, by `host:port`.
pub struct UpstreamSlots {
    slots: DashMap<String, (usize, Arc<Semaphore>)>,
    default_cap: usize,
    wait: Duration,
}

impl UpstreamSlots {
    pub fn new(server: &ServerConfig) -> UpstreamSlots {
        UpstreamSlots {
            slots: DashMap::new(),
            default_cap: server.max_upstream_connections,
            wait: server.upstream_connection_wait,
        }
    }

    /// How long a request waits for a slot.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Each upstream's cap under `routes`: the smallest of the server's and those of the routes
    /// naming it. Routes whose upstream does not parse are left out (validation refuses them).
    pub fn caps_for(&self, routes: &[RouteConfig]) -> HashMap<String, usize> {
        let mut caps = HashMap::new();
        for route in routes {
            let Ok(target) = UpstreamTarget::parse(&route.upstream) else {
                continue;
            };
            let cap = route
                .max_upstream_connections
                .map_or(self.default_cap, |own| own.min(self.default_cap));
            let entry = caps.entry(target.slot_name()).or_insert(cap);
            *entry = (*entry).min(cap);
        }
        caps
    }

    /// Puts `caps` in force: an upstream whose cap changed gets fresh slots (connections open
    /// under the old ones keep theirs until they close).
    pub fn apply(&self, caps: &HashMap<String, usize>) {
        for (upstream, &cap) in caps {
            let unchanged = self.slots.get(upstream).is_some_and(|slots| slots.0 == cap);
            if !unchanged {
                self.slots
                    .insert(upstream.clone(), (cap, Arc::new(Semaphore::new(cap))));
            }
        }
    }

    fn slots_of(&self, upstream: &str) -> (usize, Arc<Semaphore>) {
        if let Some(slots) = self.slots.get(upstream) {
            return (slots.0, Arc::clone(&slots.1));
        }
        let entry = self
            .slots
            .entry(upstream.to_owned())
            .or_insert_with(|| (self.default_cap, Arc::new(Semaphore::new(self.default_cap))));
        (entry.0, Arc::clone(&entry.1))
    }
}

/// The name an upstream's slots go by: `host:port`, the port made explicit.
pub fn slot_name(uri: &Uri) -> String {
    let host = uri.host().unwrap_or_default();
    let default_port = if uri.scheme() == Some(&http::uri::Scheme::HTTPS) {
        443
    } else {
        80
    };
    let port = uri.port_u16().unwrap_or(default_port);
    format!("{host}:{port}")
}

/// Connects to upstreams only with a slot.
#[derive(Clone)]
pub struct CappedConnector {
    inner: HttpConnector,
    slots: Arc<UpstreamSlots>,
}

impl CappedConnector {
    pub fn new(inner: HttpConnector, slots: Arc<UpstreamSlots>) -> CappedConnector {
        CappedConnector { inner, slots }
    }
}

impl Service<Uri> for CappedConnector {
    type Response = CappedStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<CappedStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let upstream = slot_name(&uri);
        let (cap, slots) = self.slots.slots_of(&upstream);
        let wait = self.slots.wait;
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let slot = match tokio::time::timeout(wait, slots.acquire_owned()).await {
                Ok(Ok(slot)) => slot,
                _ => {
                    return Err(Box::new(UpstreamBusy {
                        upstream,
                        cap,
                        wait,
                    }) as BoxError)
                }
            };
            let stream = inner.call(uri).await?.into_inner();
            Ok(CappedStream {
                stream,
                _slot: slot,
            })
        })
    }
}

/// A connection to an upstream, holding its slot until it is dropped.
pub struct CappedStream {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for CappedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Whether `error` (or an error it wraps) is a wait for an upstream slot that ran out.
pub fn upstream_busy(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<UpstreamBusy>() {
            return true;
        }
        current = e.source();
    }
    false
}
