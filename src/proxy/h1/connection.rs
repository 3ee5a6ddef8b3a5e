//! One upstream connection and its exchange: the request's head and body written (head and first
//! data in one write where they are ready together), the response head read, 1xx heads skipped.
//! A response that starts before the request body is all sent ends the sending: the response is
//! read, and the connection is not used again.

use std::future::poll_fn;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf as _, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite};

use super::body::H1Body;
use super::head::{parse_head, response_framing, FieldSpans, Parsed, ResponseHead};
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
    /// A final response head arrived first; the rest of the body was not sent.
    CutShortByResponse,
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
        !matches!(self.poll_read_more(&mut cx), Poll::Pending)
    }

    /// Reads what the upstream has sent into `read`: the number of bytes, 0 at its end.
    pub(super) fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, H1Error>> {
        if self.read.capacity() - self.read.len() < READ_SPACE / 4 {
            self.read.reserve(READ_SPACE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read)
            .map_err(H1Error::Read)
    }

    /// Sends `request` (origin-form URI) and reads its response's head. The body reads the rest
    /// from this connection and, read to its end, gives it back through
    /// [`H1Body::take_reusable`] if the upstream keeps it open.
    pub async fn send(
        mut self,
        request: Request<RequestBody>,
    ) -> Result<Response<H1Body>, H1Error> {
        let (mut parts, body) = request.into_parts();
        let framing = frame_request(&mut parts, &body);
        self.write.clear();
        encode_head(&mut self.write, &parts);
        let sent = self.send_body(body, framing).await?;
        let head = self.read_head().await?;
        let framing = response_framing(&head, &parts.method)?;
        let reusable = head.keep_alive && sent == Sent::Whole;
        let mut response = Response::new(());
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        if let Some(reason) = head.reason {
            response.extensions_mut().insert(reason);
        }
        Ok(response.map(|()| H1Body::new(self, framing, reusable)))
    }

    /// Writes the head already in `write`, then the body framed by `framing`, watching for a
    /// response that comes first.
    async fn send_body(
        &mut self,
        mut body: RequestBody,
        framing: RequestFraming,
    ) -> Result<Sent, H1Error> {
        let mut sending = Sending {
            framing,
            sent: 0,
            written: 0,
            data: Bytes::new(),
            chunks: 0,
            ended: matches!(framing, RequestFraming::Length(0)),
        };
        poll_fn(|cx| sending.poll(self, &mut body, cx)).await
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
    /// before it are dropped.
    fn final_head_arrived(&mut self) -> Result<bool, H1Error> {
        loop {
            let mut probe = self.read.clone();
            match parse_head(&mut probe, &mut self.spans)? {
                Parsed::Informational(length) => self.read.advance(length),
                Parsed::Final(_) => return Ok(true),
                Parsed::Partial => return Ok(false),
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
    fn poll(
        &mut self,
        connection: &mut H1Connection,
        body: &mut RequestBody,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Sent, H1Error>> {
        loop {
            // A response before the request is all sent: it is read, and the rest not sent.
            if let Poll::Ready(read) = connection.poll_read_more(cx) {
                if read? == 0 || connection.final_head_arrived()? {
                    return Poll::Ready(Ok(Sent::CutShortByResponse));
                }
                continue;
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
