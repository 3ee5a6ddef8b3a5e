//! A client connection's socket with its request bytes run through a [`FramingScanner`] on the
//! way to hyper, and the per-connection record that tells the service which request (by its
//! number on the connection) had conflicting framing.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::framing::FramingScanner;

/// Marks a request whose head carried both `Content-Length` and `Transfer-Encoding`; the
/// gateway refuses it before any layer runs.
#[derive(Debug, Clone, Copy)]
pub struct AmbiguousFraming;

/// Shared by a connection's stream (which numbers heads as they are read) and its service
/// (which numbers requests as hyper hands them over, in the same order).
#[derive(Debug, Default)]
pub struct FramingWatch {
    /// The number of the head with conflicting framing; 0 for none.
    conflict_at: AtomicU64,
    requests: AtomicU64,
}

impl FramingWatch {
    /// Counts one request handed over by hyper; true if its head had conflicting framing.
    pub fn next_request_is_ambiguous(&self) -> bool {
        let number = self.requests.fetch_add(1, Ordering::AcqRel) + 1;
        self.conflict_at.load(Ordering::Acquire) == number
    }
}

/// The socket of one client connection, watched.
pub struct WatchedStream {
    inner: TcpStream,
    scanner: FramingScanner,
    watch: Arc<FramingWatch>,
}

impl WatchedStream {
    pub fn new(inner: TcpStream, max_head_bytes: usize, watch: Arc<FramingWatch>) -> Self {
        WatchedStream {
            inner,
            scanner: FramingScanner::new(max_head_bytes),
            watch,
        }
    }
}

impl AsyncRead for WatchedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if let Some(head) = this.scanner.feed(&buf.filled()[before..]) {
                this.watch.conflict_at.store(head, Ordering::Release);
            }
        }
        polled
    }
}

impl AsyncWrite for WatchedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::FramingWatch;
    use std::sync::atomic::Ordering;

    #[test]
    fn only_the_request_with_the_conflicting_head_is_ambiguous() {
        let watch = FramingWatch::default();
        assert!(!watch.next_request_is_ambiguous());
        watch.conflict_at.store(3, Ordering::Release);
        assert!(!watch.next_request_is_ambiguous());
        assert!(watch.next_request_is_ambiguous());
        assert!(!watch.next_request_is_ambiguous());
    }
}
