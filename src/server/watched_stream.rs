//! A client connection's socket (or one half of it), watched: its reads and blocked writes are
//! noted on the connection's [`ConnectionActivity`], which its clock reads.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::activity::ConnectionActivity;

/// The socket of one client connection (or its TLS session, or a half of either), watched.
pub struct WatchedStream<S = TcpStream> {
    inner: S,
    activity: Arc<ConnectionActivity>,
}

impl<S> WatchedStream<S> {
    pub fn new(inner: S, activity: Arc<ConnectionActivity>) -> Self {
        WatchedStream { inner, activity }
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
            this.activity.note_read(buf.filled().len() - before);
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
