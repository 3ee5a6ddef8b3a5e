//! One upstream connection and its exchange: the request's head and body written (head and first
//! data in one write where they are ready together), the response head read, 1xx heads skipped.
//! A final response that arrives before the request body is all sent is answered at once: an
//! error status (4xx, 5xx) ends the sending, any other lets the rest of the body go on being sent
//! beside the response's body (as an upstream streaming its answer to an upload expects). Either
//! way the connection is not used again.

use std::future::{poll_fn, Future as _};
use std::io::IoSlice;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

use bytes::{Buf as _, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite};

use super::head::{
    normalize_content_length, parse_head, peek_head, response_framing, FieldSpans, Parsed, Peeked,
    ResponseFraming, ResponseHead,
};
use super::request::{chunk_start, chunked_end, encode_head, frame_request, RequestFraming};
use super::{H1Error, MAX_RESPONSE_HEAD_BYTES};
use crate::body::RequestBody;

/// Bytes made room for before each read.
const READ_SPACE: usize = 8 * 1024;

/// What an upstream connection runs over: TCP, or TLS over TCP.
pub trait UpstreamIo: AsyncRead + AsyncWrite + Send + Sync + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin> UpstreamIo for T {}

/// An open HTTP/1.1 connection to an upstream, between exchanges.
pub struct H1Connection {
    io: Box<dyn UpstreamIo>,
    /// Bytes read and not yet taken: the response being read.
    pub(super) read: BytesMut,
    /// The request head (and chunk framing) being written.
    write: Vec<u8>,
    /// Scratch space for parsing response heads.
    spans: FieldSpans,
}

/// How the sending of a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Whole,
    /// A final response head (or the end of the connection) arrived first.
    ResponseFirst,
}

/// The rest of a request body, sent while its response is read.
/// A response whose head has been read: the connection its body is read from, how it is framed,
/// whether the connection may carry another exchange after it, and the rest of a request body
/// still being sent.
pub(super) struct Unread {
    pub(super) connection: H1Connection,
    pub(super) framing: ResponseFraming,
    pub(super) reusable: bool,
    pub(super) upload: Option<Box<Upload>>,
}

pub(super) struct Upload {
    sending: Sending,
    body: RequestBody,
}

impl Upload {
    /// Sends what it can: ready once the body is all sent.
    pub(super) fn poll(
        &mut self,
        connection: &mut H1Connection,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), H1Error>> {
        self.sending
            .poll(connection, &mut self.body, cx, false)
            .map_ok(|_| ())
    }
}

impl H1Connection {
    pub fn new(io: impl UpstreamIo + 'static) -> H1Connection {
        H1Connection {
            io: Box::new(io),
            read: BytesMut::new(),
            write: Vec::new(),
            spans: Vec::with_capacity(16),
        }
    }

    /// Whether the upstream has closed this idle connection (or sent on it unasked), seen without
    /// waiting: a pooled connection is checked so before it is lent.
    pub fn is_closed(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        // Outside tokio's task budget: a spent budget would make a closed socket look open.
        let mut look = pin!(tokio::task::unconstrained(poll_fn(|cx| {
            Poll::Ready(self.poll_read_more(cx))
        })));
        !matches!(look.as_mut().poll(&mut cx), Poll::Ready(Poll::Pending))
    }

    /// Reads what the upstream has sent into `read`: the number of bytes, 0 at its end.
    pub(super) fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, H1Error>> {
        if self.read.capacity() - self.read.len() < READ_SPACE / 4 {
            self.read.reserve(READ_SPACE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read)
            .map_err(H1Error::Read)
    }

    /// Sends `request` (origin-form URI) and reads its response's head; what is left to read
    /// comes back with it (`H1Connection::send` makes that the response's body).
    pub(super) async fn send_head(
        mut self,
        request: Request<RequestBody>,
    ) -> Result<Response<Unread>, H1Error> {
        let (mut parts, mut body) = request.into_parts();
        let framing = frame_request(&mut parts, &body);
        self.write.clear();
        encode_head(&mut self.write, &parts);
        let mut sending = Sending::new(framing);
        let sent = poll_fn(|cx| sending.poll(&mut self, &mut body, cx, true)).await?;
        let mut head = self.read_head().await?;
        let framing = response_framing(&head, &parts.method)?;
        normalize_content_length(&mut head.headers);
        let upload = (sent == Sent::ResponseFirst
            && !head.status.is_client_error()
            && !head.status.is_server_error())
        .then(|| Box::new(Upload { sending, body }));
        let reusable = head.keep_alive && sent == Sent::Whole;
        let mut response = Response::new(());
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        if let Some(reason) = head.reason {
            response.extensions_mut().insert(reason);
        }
        Ok(response.map(|()| Unread {
            connection: self,
            framing,
            reusable,
            upload,
        }))
    }

    /// Reads until a final response head is whole, skipping 1xx heads.
    async fn read_head(&mut self) -> Result<ResponseHead, H1Error> {
        loop {
            match parse_head(&mut self.read, &mut self.spans)? {
                Parsed::Final(head) => return Ok(head),
                Parsed::Informational(length) => {
                    self.read.advance(length);
                    continue;
                }
                Parsed::Partial if self.read.len() >= MAX_RESPONSE_HEAD_BYTES => {
                    return Err(H1Error::HeadTooLarge)
                }
                Parsed::Partial => {}
            }
            if poll_fn(|cx| self.poll_read_more(cx)).await? == 0 {
                return Err(if self.read.is_empty() {
                    H1Error::ClosedBeforeResponse
                } else {
                    H1Error::Malformed("the response head ends early")
                });
            }
        }
    }

    /// Whether `read` starts with a whole final response head, once any whole 1xx heads
    /// before it are dropped; a head past the size limit fails.
    fn final_head_arrived(&mut self) -> Result<bool, H1Error> {
        loop {
            match peek_head(&self.read)? {
                Peeked::Informational(length) => self.read.advance(length),
                Peeked::Final { .. } => return Ok(true),
                Peeked::Partial if self.read.len() >= MAX_RESPONSE_HEAD_BYTES => {
                    return Err(H1Error::HeadTooLarge)
                }
                Peeked::Partial => return Ok(false),
            }
        }
    }
}

/// A request body being written.
struct Sending {
    framing: RequestFraming,
    /// Body bytes taken from the body so far.
    sent: u64,
    /// How much of the connection's `write` buffer is written.
    written: usize,
    /// Body data after `write`, not yet written.
    data: Bytes,
    /// Chunks framed so far.
    chunks: u64,
    /// Whether the body has ended (its last framing is in `write`).
    ended: bool,
}

impl Sending {
    fn new(framing: RequestFraming) -> Sending {
        Sending {
            framing,
            sent: 0,
            written: 0,
            data: Bytes::new(),
            chunks: 0,
            ended: matches!(framing, RequestFraming::Length(0)),
        }
    }

    /// Writes the head in the connection's `write` buffer, then the body. With `watch`, it stops
    /// as soon as a final response head (or the connection's end) arrives.
    fn poll(
        &mut self,
        connection: &mut H1Connection,
        body: &mut RequestBody,
        cx: &mut Context<'_>,
        watch: bool,
    ) -> Poll<Result<Sent, H1Error>> {
        loop {
            if watch {
                if let Poll::Ready(read) = connection.poll_read_more(cx) {
                    if read? == 0 || connection.final_head_arrived()? {
                        return Poll::Ready(Ok(Sent::ResponseFirst));
                    }
                    continue;
                }
            }
            // The next data goes out in the same write as what is before it, when it is ready.
            let mut body_waits = false;
            if !self.ended && self.data.is_empty() {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Pending => body_waits = true,
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(H1Error::RequestBody(e))),
                    Poll::Ready(Some(Ok(frame))) => {
                        // Trailers are not sent: `Trailer` is hop-by-hop and never reaches here.
                        if let Ok(data) = frame.into_data() {
                            self.take(connection, data)?;
                        }
                    }
                    Poll::Ready(None) => self.end(connection)?,
                }
            }
            while self.pending(connection) {
                let written = {
                    let head = &connection.write[self.written..];
                    let slices = [IoSlice::new(head), IoSlice::new(&self.data)];
                    match Pin::new(&mut connection.io).poll_write_vectored(cx, &slices) {
                        Poll::Ready(Ok(0)) => {
                            return Poll::Ready(Err(H1Error::Write(
                                std::io::ErrorKind::WriteZero.into(),
                            )))
                        }
                        Poll::Ready(Ok(written)) => written,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(H1Error::Write(e))),
                        Poll::Pending => return Poll::Pending,
                    }
                };
                let from_head = written.min(connection.write.len() - self.written);
                self.written += from_head;
                self.data.advance(written - from_head);
            }
            connection.write.clear();
            self.written = 0;
            if self.ended || body_waits {
                // What a TLS stream took but could not yet pass to the socket goes out now, not
                // when the next write comes (there may be none).
                match Pin::new(&mut connection.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(H1Error::Write(e))),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if self.ended {
                return Poll::Ready(Ok(Sent::Whole));
            }
            if body_waits {
                return Poll::Pending;
            }
        }
    }

    /// Whether bytes wait to be written.
    fn pending(&self, connection: &H1Connection) -> bool {
        self.written < connection.write.len() || !self.data.is_empty()
    }

    fn take(&mut self, connection: &mut H1Connection, data: Bytes) -> Result<(), H1Error> {
        if data.is_empty() {
            return Ok(());
        }
        self.sent += data.len() as u64;
        match self.framing {
            RequestFraming::Length(declared) if self.sent > declared => {
                return Err(H1Error::RequestBodyLength { declared })
            }
            RequestFraming::Length(declared) => self.ended = self.sent == declared,
            RequestFraming::Chunked => {
                chunk_start(&mut connection.write, data.len(), self.chunks > 0);
                self.chunks += 1;
            }
        }
        self.data = data;
        Ok(())
    }

    fn end(&mut self, connection: &mut H1Connection) -> Result<(), H1Error> {
        match self.framing {
            RequestFraming::Length(declared) if self.sent != declared => {
                Err(H1Error::RequestBodyLength { declared })
            }
            RequestFraming::Length(_) => {
                self.ended = true;
                Ok(())
            }
            RequestFraming::Chunked => {
                chunked_end(&mut connection.write, self.chunks > 0);
                self.ended = true;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use http_body_util::BodyExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream, ReadBuf};

    use super::*;

    /// Takes every write at once and passes it on only when flushed, as a TLS stream does with
    /// what its socket cannot yet take.
    struct HeldUntilFlushed {
        inner: DuplexStream,
        held: Vec<u8>,
    }

    impl AsyncRead for HeldUntilFlushed {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for HeldUntilFlushed {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().held.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            while !this.held.is_empty() {
                let written = ready!(Pin::new(&mut this.inner).poll_write(cx, &this.held))?;
                this.held.drain(..written);
            }
            Pin::new(&mut this.inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }
    }

    use std::task::ready;

    /// Reads a request head and `body` bytes after it, then answers `answer`.
    async fn upstream(mut theirs: DuplexStream, body: usize, answer: &'static [u8]) -> Vec<u8> {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let head_end = seen.windows(4).position(|w| w == b"\r\n\r\n");
            if head_end.is_some_and(|end| seen.len() >= end + 4 + body) {
                break;
            }
            let n = theirs.read(&mut buf).await.expect("reads");
            assert!(n > 0, "the gateway closed before the whole request");
            seen.extend_from_slice(&buf[..n]);
        }
        theirs.write_all(answer).await.expect("answers");
        seen
    }

    fn post(body: Vec<u8>) -> Request<RequestBody> {
        Request::post("/up")
            .header("host", "upstream")
            .body(RequestBody::full(Bytes::from(body)))
            .expect("request")
    }

    #[tokio::test]
    async fn what_a_stream_holds_back_is_flushed_before_the_response_is_awaited() {
        let (ours, theirs) = tokio::io::duplex(16 * 1024);
        let seen = tokio::spawn(upstream(
            theirs,
            100_000,
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ));
        let connection = H1Connection::new(HeldUntilFlushed {
            inner: ours,
            held: Vec::new(),
        });
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            connection.send(post(vec![7u8; 100_000])),
        )
        .await
        .expect("answered: the held bytes were flushed")
        .expect("exchange");
        assert_eq!(response.status(), 200);
        let seen = seen.await.expect("upstream");
        assert!(seen.starts_with(b"POST /up HTTP/1.1\r\n"));
        assert!(seen.ends_with(&[7u8; 100_000]));
    }

    #[tokio::test]
    async fn a_chunked_body_goes_out_framed_through_a_narrow_pipe_and_interim_heads_are_skipped() {
        let (ours, theirs) = tokio::io::duplex(64);
        let frames =
            futures_util::stream::iter([&b"hello "[..], b"", b"chunked ", b"world"].map(|piece| {
                Ok::<_, crate::body::BoxError>(http_body::Frame::data(Bytes::from_static(piece)))
            }));
        let body = RequestBody::unlimited(http_body_util::StreamBody::new(frames).boxed());
        let request = Request::post("/up").body(body).expect("request");
        let expected: &[u8] = b"6\r\nhello \r\n8\r\nchunked \r\n5\r\nworld\r\n0\r\n\r\n";
        let seen = tokio::spawn(upstream(
            theirs,
            expected.len(),
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n",
        ));
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            H1Connection::new(ours).send(request),
        )
        .await
        .expect("answered")
        .expect("exchange");
        assert_eq!(response.status(), 201);
        let seen = seen.await.expect("upstream");
        let head_end = seen
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("head")
            + 4;
        let head = String::from_utf8_lossy(&seen[..head_end]).to_lowercase();
        assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
        assert_eq!(&seen[head_end..], expected);
    }
}
