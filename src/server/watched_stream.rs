//! A client connection's socket, watched: its request bytes run through a [`FramingScanner`] on
//! the way to hyper (the per-connection record tells the service which request, by its number on
//! the connection, had conflicting framing), and its reads and blocked writes are noted on the
//! connection's [`ConnectionActivity`].

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::activity::ConnectionActivity;
use super::framing::FramingScanner;

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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

/// The socket of one client connection (or its TLS session, whose decrypted bytes are what the
/// framing scanner must see), watched.
pub struct WatchedStream<S = TcpStream> {
    inner: S,
    framing: Option<(FramingScanner, Arc<FramingWatch>)>,
    activity: Arc<ConnectionActivity>,
    first_read: bool,
}

impl<S> WatchedStream<S> {
    /// A data-plane connection: framing scanned, activity noted.
    pub fn new(
        inner: S,
        max_head_bytes: usize,
        watch: Arc<FramingWatch>,
        activity: Arc<ConnectionActivity>,
    ) -> Self {
        WatchedStream {
            inner,
            framing: Some((FramingScanner::new(max_head_bytes), watch)),
            activity,
            first_read: true,
        }
    }

    /// A connection whose activity is noted but whose framing is not scanned (the admin
    /// listener's).
    pub fn unscanned(inner: S, activity: Arc<ConnectionActivity>) -> Self {
        WatchedStream {
            inner,
            framing: None,
            activity,
            first_read: true,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WatchedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let read = &buf.filled()[before..];
            if this.first_read && !read.is_empty() {
                this.first_read = false;
                if read.starts_with(HTTP2_PREFACE) {
                    this.activity.note_http2();
                }
            }
            this.activity.note_read(read.len());
            if let Some((scanner, watch)) = &mut this.framing {
                if let Some(head) = scanner.feed(read) {
                    watch.conflict_at.store(head, Ordering::Release);
                }
            }
        }
        polled
    }
}

/// Notes on the activity whether a write went through or would block.
fn noted<T>(activity: &ConnectionActivity, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
    match &polled {
        Poll::Pending => activity.note_write_blocked(),
        Poll::Ready(_) => activity.note_written(),
    }
    polled
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WatchedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        noted(
            &this.activity,
            Pin::new(&mut this.inner).poll_write(cx, buf),
        )
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        noted(
            &this.activity,
            Pin::new(&mut this.inner).poll_write_vectored(cx, bufs),
        )
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A TCP stream's flush is always ready; a TLS session's may wait on the socket, which a
        // write will then also find blocked.
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
