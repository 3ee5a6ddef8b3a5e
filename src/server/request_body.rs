//! The body of a request served by the gateway's HTTP/1 server, read off the client connection
//! when the gateway polls it: the connection's read half and buffer are shared between the body
//! and the connection's loop, which takes them back once the exchange is over. The first poll of
//! a body whose client waits (`Expect: 100-continue`) asks the loop to send `100 Continue`.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::{BufMut as _, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncRead;

use crate::proxy::body_decoder::{BodyDecoder, BodyFraming, DecodeError, Decoded};

/// Room made in the read buffer before a read, and the least left before a new allocation.
pub const READ_SPACE: usize = 8 * 1024;

/// Where a client waiting for `100 Continue` stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continue {
    /// The client does not wait (or the answer is sent).
    NotWaiting,
    /// It waits; the body has not been polled.
    Waiting,
    /// The body was polled: the loop is to send `100 Continue`.
    Wanted,
}

/// Why a request body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("reading the request body failed: {0}")]
    Read(#[from] io::Error),
    #[error("the connection moved on before the request body was read to its end")]
    Abandoned,
}

/// A connection's read half, its buffer, and the body being read from them.
#[derive(Debug)]
pub struct ReadSide<R> {
    /// `None` once the connection has ended: a body still held then fails.
    io: Option<R>,
    pub buffer: BytesMut,
    /// The number of the request whose body may read; a body of another number has ended.
    current: u64,
    /// The current body; `None` when it has ended or was taken back.
    decoder: Option<BodyDecoder>,
    /// The current body's value was dropped (by the gateway, unread or not).
    dropped: bool,
    /// The client has closed its side (seen by any read).
    eof: bool,
    /// The client closed while the gateway was at work on a request whose body had ended.
    gone: bool,
    pub expect: Continue,
    /// The connection's loop, woken when the body wants `100 Continue` sent.
    loop_waker: Option<Waker>,
}

impl<R> ReadSide<R> {
    /// The connection has ended: its read half is dropped, and a body still held fails.
    pub fn close(&mut self) {
        self.current = u64::MAX;
        self.decoder = None;
        self.io = None;
    }
}

impl<R: AsyncRead + Unpin> ReadSide<R> {
    pub fn new(io: R, buffer: BytesMut) -> ReadSide<R> {
        ReadSide {
            io: Some(io),
            buffer,
            current: 0,
            decoder: None,
            dropped: false,
            eof: false,
            gone: false,
            expect: Continue::NotWaiting,
            loop_waker: None,
        }
    }

    /// Reads what the client has sent into the buffer, at most `limit` bytes: the number read,
    /// 0 at the client's end (or once the connection has ended).
    pub fn poll_read_more(
        &mut self,
        cx: &mut Context<'_>,
        limit: usize,
    ) -> Poll<io::Result<usize>> {
        let Some(io) = &mut self.io else {
            return Poll::Ready(Ok(0));
        };
        if self.buffer.capacity() - self.buffer.len() < READ_SPACE / 4 {
            self.buffer.reserve(READ_SPACE);
        }
        if limit < self.buffer.capacity() - self.buffer.len() {
            // Reads through a limited view, so that no byte past `limit` is taken.
            let mut limited = (&mut self.buffer).limit(limit);
            return tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut limited);
        }
        tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut self.buffer)
    }

    /// Starts the body of request `number`, framed as `framing`.
    pub fn start_body(&mut self, number: u64, framing: BodyFraming, expect_continue: bool) {
        let decoder = BodyDecoder::new(framing);
        self.current = number;
        self.expect = if expect_continue && !decoder.is_done() {
            Continue::Waiting
        } else {
            Continue::NotWaiting
        };
        self.decoder = (!decoder.is_done()).then_some(decoder);
        self.dropped = false;
    }

    /// While the gateway works on a request whose body has ended and nothing of the next request
    /// is buffered: one read ahead, so that a client that closes is noticed (as hyper's server
    /// notices it). Ready when it has closed (or its socket failed): the request is abandoned.
    /// An end the body's own reads met is not this: the gateway answers that request.
    pub fn poll_client_gone(&mut self, cx: &mut Context<'_>, limit: usize) -> Poll<()> {
        if self.gone {
            return Poll::Ready(());
        }
        if self.decoder.is_some() || self.eof || !self.buffer.is_empty() {
            return Poll::Pending;
        }
        match std::task::ready!(self.poll_read_more(cx, limit)) {
            Ok(0) | Err(_) => {
                self.eof = true;
                self.gone = true;
                Poll::Ready(())
            }
            Ok(_) => Poll::Pending,
        }
    }

    /// Before the response to a request whose body the gateway dropped unread: one step of it,
    /// as hyper's server takes (from the buffer, or one read when the buffer is empty). False if
    /// the body has not ended with it: the connection must close after the response. (A body by
    /// length that has all arrived ends in one step; a chunked one, whole or not, does not.)
    pub fn skip_dropped_body(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.dropped {
            return true;
        }
        let mut read_once = false;
        loop {
            let Some(decoder) = &mut self.decoder else {
                return true;
            };
            let ended = match decoder.decode(&mut self.buffer) {
                Ok(Decoded::End) => true,
                Ok(Decoded::Frame(_)) => decoder.is_done(),
                Err(_) => false,
                Ok(Decoded::NeedMore) if !read_once => {
                    read_once = true;
                    match self.poll_read_more(cx, READ_SPACE) {
                        Poll::Ready(Ok(n)) if n > 0 => continue,
                        Poll::Ready(Ok(_) | Err(_)) => self.eof = true,
                        Poll::Pending => {}
                    }
                    false
                }
                Ok(Decoded::NeedMore) => false,
            };
            if ended {
                self.decoder = None;
            }
            return ended;
        }
    }

    /// Sets the loop's waker for a body that wants `100 Continue`.
    pub fn set_loop_waker(&mut self, waker: &Waker) {
        match &self.loop_waker {
            Some(known) if known.will_wake(waker) => {}
            _ => self.loop_waker = Some(waker.clone()),
        }
    }

    /// Ends the current body for good, reading what is left of it from the buffer alone: true if
    /// it had ended or ends there (the connection can carry another request). A body value
    /// still held somewhere fails from now on if it had not ended.
    pub fn take_back(&mut self) -> bool {
        self.current += 1;
        self.expect = Continue::NotWaiting;
        if self.eof {
            return false;
        }
        let Some(mut decoder) = self.decoder.take() else {
            return true;
        };
        loop {
            match decoder.decode(&mut self.buffer) {
                Ok(Decoded::Frame(_)) => {}
                Ok(Decoded::End) => return true,
                Ok(Decoded::NeedMore) | Err(_) => return false,
            }
        }
    }

    fn poll_frame(
        &mut self,
        number: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        if number != self.current {
            return Poll::Ready(Some(Err(RequestBodyError::Abandoned)));
        }
        let Some(decoder) = &mut self.decoder else {
            return Poll::Ready(None);
        };
        if self.expect == Continue::Waiting {
            // The first read of the body: the client is told to send it (hyper's server does so
            // even when the body came with the head).
            self.expect = Continue::Wanted;
            if let Some(waker) = &self.loop_waker {
                waker.wake_by_ref();
            }
        }
        loop {
            match decoder.decode(&mut self.buffer) {
                Ok(Decoded::Frame(frame)) => {
                    if decoder.is_done() {
                        // Ended with this frame: the body's last step (a reader that stops at
                        // its length never asks for the end).
                        self.decoder = None;
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(Decoded::End) => {
                    self.decoder = None;
                    return Poll::Ready(None);
                }
                Err(e) => {
                    self.decoder = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Ok(Decoded::NeedMore) => {}
            }
            // Fields are borrowed one by one: the decoder stays borrowed from `self.decoder`.
            let Some(io) = &mut self.io else {
                return Poll::Ready(Some(Err(RequestBodyError::Abandoned)));
            };
            if self.buffer.capacity() - self.buffer.len() < READ_SPACE / 4 {
                self.buffer.reserve(READ_SPACE);
            }
            match tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut self.buffer) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    self.eof = true;
                    let ended = decoder.closed();
                    self.decoder = None;
                    return Poll::Ready(ended.err().map(|e| Err(e.into())));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    self.decoder = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }
}

/// The read side shared by a connection's loop and its request bodies.
pub type SharedReadSide<R> = Arc<Mutex<ReadSide<R>>>;

pub fn lock<R>(shared: &SharedReadSide<R>) -> MutexGuard<'_, ReadSide<R>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The body of one request.
#[derive(Debug)]
pub struct RequestBody<R> {
    shared: SharedReadSide<R>,
    number: u64,
    /// Its size as the head framed it, until it ends.
    hint: SizeHint,
    ended: bool,
}

impl<R> RequestBody<R> {
    /// The body of request `number`, whose reading [`ReadSide::start_body`] started.
    pub fn new(shared: SharedReadSide<R>, number: u64, framing: BodyFraming) -> RequestBody<R> {
        let (hint, ended) = match framing {
            BodyFraming::Length(length) => (SizeHint::with_exact(length), length == 0),
            BodyFraming::Chunked | BodyFraming::UntilClose => (SizeHint::default(), false),
        };
        RequestBody {
            shared,
            number,
            hint,
            ended,
        }
    }
}

impl<R> Drop for RequestBody<R> {
    fn drop(&mut self) {
        let mut side = lock(&self.shared);
        if side.current == self.number {
            side.dropped = true;
        }
    }
}

impl<R: AsyncRead + Unpin> Body for RequestBody<R> {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let polled = lock(&this.shared).poll_frame(this.number, cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(left)) = (frame.data_ref(), this.hint.exact()) {
                    this.hint = SizeHint::with_exact(left.saturating_sub(data.len() as u64));
                }
            }
            Poll::Ready(_) => {
                this.ended = true;
                this.hint = SizeHint::with_exact(0);
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.hint.exact() == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use http_body_util::BodyExt as _;

    use super::*;

    /// A read side over `sent` (what the client sent after the head; then it waits), with
    /// `buffered` already read.
    fn side(buffered: &[u8], sent: &'static [u8]) -> SharedReadSide<tokio::io::DuplexStream> {
        let (client, server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            let mut client = client;
            let _ = client.write_all(sent).await;
            // Held open: the client neither closes nor sends more.
            std::future::pending::<()>().await;
        });
        Arc::new(Mutex::new(ReadSide::new(server, BytesMut::from(buffered))))
    }

    async fn skip(shared: &SharedReadSide<tokio::io::DuplexStream>) -> bool {
        tokio::task::yield_now().await;
        poll_fn(|cx| Poll::Ready(lock(shared).skip_dropped_body(cx))).await
    }

    #[tokio::test]
    async fn a_dropped_body_is_skipped_in_one_step_only_when_it_has_all_arrived_by_length() {
        let whole = side(b"hello", b"");
        lock(&whole).start_body(1, BodyFraming::Length(5), false);
        drop(RequestBody::new(
            Arc::clone(&whole),
            1,
            BodyFraming::Length(5),
        ));
        assert!(skip(&whole).await);

        let unread = side(b"", b"hello");
        lock(&unread).start_body(1, BodyFraming::Length(5), false);
        drop(RequestBody::new(
            Arc::clone(&unread),
            1,
            BodyFraming::Length(5),
        ));
        assert!(skip(&unread).await, "one read takes what was sent");

        let short = side(b"hel", b"");
        lock(&short).start_body(1, BodyFraming::Length(5), false);
        drop(RequestBody::new(
            Arc::clone(&short),
            1,
            BodyFraming::Length(5),
        ));
        assert!(!skip(&short).await);

        let chunked = side(b"5\r\nhello\r\n0\r\n\r\n", b"");
        lock(&chunked).start_body(1, BodyFraming::Chunked, false);
        drop(RequestBody::new(
            Arc::clone(&chunked),
            1,
            BodyFraming::Chunked,
        ));
        assert!(
            !skip(&chunked).await,
            "a chunked body takes more than one step"
        );

        let held = side(b"", b"");
        lock(&held).start_body(1, BodyFraming::Length(5), false);
        let body = RequestBody::new(Arc::clone(&held), 1, BodyFraming::Length(5));
        assert!(skip(&held).await, "a body still held is not skipped");
        drop(body);
    }

    #[tokio::test]
    async fn the_first_read_of_a_waiting_clients_body_wants_100_continue() {
        let shared = side(b"hello", b"");
        lock(&shared).start_body(1, BodyFraming::Length(5), true);
        assert_eq!(lock(&shared).expect, Continue::Waiting);
        let body = RequestBody::new(Arc::clone(&shared), 1, BodyFraming::Length(5));
        let collected = body.collect().await.expect("the body").to_bytes();
        assert_eq!(&collected[..], b"hello");
        assert_eq!(lock(&shared).expect, Continue::Wanted);
    }

    #[tokio::test]
    async fn a_body_still_held_when_the_connection_moves_on_fails_rather_than_ends() {
        let shared = side(b"he", b"");
        lock(&shared).start_body(1, BodyFraming::Length(5), false);
        let mut body = RequestBody::new(Arc::clone(&shared), 1, BodyFraming::Length(5));
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), "he");
        assert!(!lock(&shared).take_back(), "the body had not ended");
        let after = body.frame().await.expect("an error, not the end");
        assert!(matches!(after, Err(RequestBodyError::Abandoned)));
    }

    #[tokio::test]
    async fn a_client_that_closes_while_the_gateway_works_is_noticed() {
        let (client, server) = tokio::io::duplex(1024);
        let shared: SharedReadSide<_> =
            Arc::new(Mutex::new(ReadSide::new(server, BytesMut::new())));
        lock(&shared).start_body(1, BodyFraming::Length(0), false);
        let gone = poll_fn(|cx| Poll::Ready(lock(&shared).poll_client_gone(cx, 1024).is_ready()));
        assert!(!gone.await);
        drop(client);
        poll_fn(|cx| lock(&shared).poll_client_gone(cx, 1024)).await;
    }
}
