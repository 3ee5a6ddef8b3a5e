//! A client connection's stream as the servers take it: split into halves for the gateway's
//! HTTP/1 server (a TCP socket's own halves; a TLS session's behind a lock), and with the bytes
//! read while telling HTTP/2 from HTTP/1 given back first for hyper's HTTP/2 server.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
pub const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the first bytes of a connection say it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
    /// Not known yet: more bytes are needed.
    Undecided,
}

/// Reads `first` (the bytes read so far) as hyper's automatic server does: HTTP/2 only with the
/// whole preface.
pub fn protocol_of(first: &[u8]) -> Protocol {
    let seen = first.len().min(HTTP2_PREFACE.len());
    if first[..seen] != HTTP2_PREFACE[..seen] {
        Protocol::Http1
    } else if seen == HTTP2_PREFACE.len() {
        Protocol::Http2
    } else {
        Protocol::Undecided
    }
}

/// A stream the HTTP/1 server can read and write from different places.
pub trait SplitIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type Read: AsyncRead + Unpin + Send + 'static;
    type Write: AsyncWrite + Unpin + Send + 'static;
    fn split_io(self) -> (Self::Read, Self::Write);
}

impl SplitIo for TcpStream {
    type Read = OwnedReadHalf;
    type Write = OwnedWriteHalf;
    fn split_io(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        self.into_split()
    }
}

impl SplitIo for TlsStream<TcpStream> {
    type Read = tokio::io::ReadHalf<Self>;
    type Write = tokio::io::WriteHalf<Self>;
    fn split_io(self) -> (Self::Read, Self::Write) {
        tokio::io::split(self)
    }
}

/// `inner`, whose reads first return `prefix`.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: BytesMut,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: BytesMut, inner: S) -> Prefixed<S> {
        Prefixed { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.is_empty() {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let take = this.prefix.len().min(buf.remaining());
        buf.put_slice(&this.prefix[..take]);
        this.prefix.advance(take);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
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
    use tokio::io::AsyncReadExt as _;

    use super::*;

    #[test]
    fn only_the_whole_preface_is_http2() {
        assert_eq!(protocol_of(b""), Protocol::Undecided);
        assert_eq!(protocol_of(b"PRI * HTTP/2.0\r\n"), Protocol::Undecided);
        assert_eq!(protocol_of(HTTP2_PREFACE), Protocol::Http2);
        assert_eq!(protocol_of(b"PRI * HTTP/1.1\r\n"), Protocol::Http1);
        assert_eq!(protocol_of(b"GET / HTTP/1.1\r\n"), Protocol::Http1);
    }

    #[tokio::test]
    async fn the_prefix_is_read_before_the_stream() {
        let mut stream = Prefixed::new(BytesMut::from(&b"ab"[..]), &b"cd"[..]);
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.expect("read");
        assert_eq!(all, b"abcd");
    }
}
