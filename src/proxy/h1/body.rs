//! A response body read straight off its upstream connection: by length, chunk by chunk, or
//! until the upstream closes. Frames are slices of the connection's read buffer, not copies.
//! Read to its end, it gives its connection back if another exchange may use it.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf as _, Bytes};
use http_body::{Body, Frame, SizeHint};

use super::connection::{H1Connection, Upload};
use super::head::{parse_trailers, ResponseFraming};
use super::H1Error;

/// The longest chunk-size line accepted (size, extensions and line end).
const MAX_CHUNK_LINE: usize = 4096;
/// The most bytes of chunk extensions one body may carry, and the largest trailer section
/// (hyper's limits, 16 KiB each).
const MAX_CHUNK_EXTENSIONS: usize = 16 * 1024;
const MAX_TRAILER_SECTION: usize = 16 * 1024;

/// Where a body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes are still to come.
    Length(u64),
    /// A chunk-size line is next.
    ChunkSize,
    /// This many bytes of the current chunk are still to come.
    ChunkData(u64),
    /// The line end after a chunk's data is next.
    ChunkEnd,
    /// The trailer section (maybe empty) after the last chunk is next.
    Trailers,
    UntilClose,
    Done,
}

/// A response body on its connection.
pub struct H1Body {
    connection: Option<H1Connection>,
    state: State,
    /// Whether the connection may carry another exchange once this body has ended.
    reusable: bool,
    /// The rest of a request body still being sent (the response came first).
    upload: Option<Box<Upload>>,
    /// Bytes of chunk-size lines beyond their digits, so far.
    extension_bytes: usize,
}

impl H1Body {
    pub(super) fn new(
        connection: H1Connection,
        framing: ResponseFraming,
        reusable: bool,
        upload: Option<Box<Upload>>,
    ) -> H1Body {
        let state = match framing {
            ResponseFraming::Length(0) => State::Done,
            ResponseFraming::Length(length) => State::Length(length),
            ResponseFraming::Chunked => State::ChunkSize,
            ResponseFraming::UntilClose => State::UntilClose,
        };
        H1Body {
            connection: Some(connection),
            state,
            reusable: reusable && framing != ResponseFraming::UntilClose,
            upload,
            extension_bytes: 0,
        }
    }

    /// The connection, once the body has ended, if the upstream keeps it open and sent nothing
    /// past the body's end.
    pub fn take_reusable(&mut self) -> Option<H1Connection> {
        if self.state != State::Done || !self.reusable {
            return None;
        }
        self.connection
            .take()
            .filter(|connection| connection.read.is_empty())
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        let Some(connection) = self.connection.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(upload) = self.upload.as_mut() {
            if let Poll::Ready(sent) = upload.poll(connection, cx) {
                sent?;
                self.upload = None;
            }
        }
        loop {
            let buffered = connection.read.len();
            match self.state {
                State::Done => return Poll::Ready(None),
                State::Length(left) | State::ChunkData(left) if buffered > 0 => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(buffered);
                    let data = connection.read.split_to(take).freeze();
                    let left = left - take as u64;
                    self.state = match self.state {
                        State::Length(_) if left == 0 => State::Done,
                        State::Length(_) => State::Length(left),
                        _ if left == 0 => State::ChunkEnd,
                        _ => State::ChunkData(left),
                    };
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                State::UntilClose if buffered > 0 => {
                    let data = connection.read.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                State::ChunkSize => {
                    if let Some(end) = memchr::memchr(b'\n', &connection.read) {
                        if end >= MAX_CHUNK_LINE {
                            return Poll::Ready(Some(Err(H1Error::Malformed(
                                "a chunk-size line is too long",
                            ))));
                        }
                        let (size, extension) = chunk_size(&connection.read[..=end])?;
                        self.extension_bytes += extension;
                        if self.extension_bytes > MAX_CHUNK_EXTENSIONS {
                            return Poll::Ready(Some(Err(H1Error::Malformed(
                                "the chunk extensions are too long",
                            ))));
                        }
                        connection.read.advance(end + 1);
                        self.state = if size == 0 {
                            State::Trailers
                        } else {
                            State::ChunkData(size)
                        };
                        continue;
                    }
                    if buffered >= MAX_CHUNK_LINE {
                        return Poll::Ready(Some(Err(H1Error::Malformed(
                            "a chunk-size line is too long",
                        ))));
                    }
                }
                State::ChunkEnd if buffered >= 2 => {
                    if &connection.read[..2] != b"\r\n" {
                        return Poll::Ready(Some(Err(H1Error::Malformed(
                            "a chunk's data is longer than its size",
                        ))));
                    }
                    connection.read.advance(2);
                    self.state = State::ChunkSize;
                    continue;
                }
                State::Trailers if connection.read.starts_with(b"\n") => {
                    return Poll::Ready(Some(Err(H1Error::Malformed(
                        "a bare line feed ends the chunked body",
                    ))));
                }
                State::Trailers if connection.read.starts_with(b"\r\n") => {
                    connection.read.advance(2);
                    self.state = State::Done;
                    return Poll::Ready(None);
                }
                State::Trailers => {
                    if let Some(end) = memchr::memmem::find(&connection.read, b"\r\n\r\n") {
                        let trailers = parse_trailers(&connection.read[..end + 4])?;
                        connection.read.advance(end + 4);
                        self.state = State::Done;
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                    if buffered >= MAX_TRAILER_SECTION {
                        return Poll::Ready(Some(Err(H1Error::Malformed(
                            "the trailer section is too long",
                        ))));
                    }
                }
                _ => {}
            }
            // More bytes are needed.
            let read = ready!(connection.poll_read_more(cx))?;
            if read == 0 {
                if self.state == State::UntilClose {
                    self.state = State::Done;
                    self.reusable = false;
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Err(H1Error::IncompleteBody)));
            }
        }
    }
}

/// The size in a chunk-size line (`1a;name=value\r\n`) and the length of what follows its digits:
/// hexadecimal digits, then optional spaces or tabs and extensions (ignored), then CRLF.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), H1Error> {
    let malformed = || H1Error::Malformed("a chunk-size line does not parse");
    let line = line.strip_suffix(b"\r\n").ok_or_else(malformed)?;
    let digits = line
        .iter()
        .take_while(|byte| byte.is_ascii_hexdigit())
        .count();
    if digits == 0 || digits > 16 {
        return Err(malformed());
    }
    let after = &line[digits..];
    let rest = after
        .iter()
        .position(|byte| *byte != b' ' && *byte != b'\t')
        .map_or(&[][..], |start| &after[start..]);
    let control = |byte: &u8| byte.is_ascii_control() && *byte != b'\t';
    if !(rest.is_empty() || rest.starts_with(b";")) || rest.iter().any(control) {
        return Err(malformed());
    }
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| malformed())?;
    let size = u64::from_str_radix(text, 16).map_err(|_| malformed())?;
    Ok((size, after.len()))
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        let this = self.get_mut();
        let polled = this.poll_next(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            // A failed body's connection is closed now, not lent again.
            this.connection = None;
            this.state = State::Done;
            this.reusable = false;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(left) => SizeHint::with_exact(left),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    /// A body of `framing` over a connection whose upstream sends `sent`, then closes (or not).
    async fn read_body(
        framing: ResponseFraming,
        sent: &'static [u8],
        close: bool,
    ) -> (Result<(Vec<u8>, Option<http::HeaderMap>), H1Error>, H1Body) {
        let (ours, mut theirs) = tokio::io::duplex(64);
        tokio::spawn(async move {
            for piece in sent.chunks(7) {
                let _ = theirs.write_all(piece).await;
            }
            if !close {
                std::future::pending::<()>().await;
            }
        });
        let mut body = H1Body::new(H1Connection::new(ours), framing, true, None);
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(bytes) => data.extend_from_slice(&bytes),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                },
                Err(e) => return (Err(e), body),
            }
        }
        (Ok((data, trailers)), body)
    }

    #[tokio::test]
    async fn a_chunked_body_is_decoded_with_its_extensions_and_trailers() {
        let sent = b"5;ext=1\r\nhello\r\n6 ; a=\"b\"\r\n world\r\n0\r\nChecksum: 9\r\n\r\n";
        let (read, mut body) = read_body(ResponseFraming::Chunked, sent, false).await;
        let (data, trailers) = read.expect("decodes");
        assert_eq!(data, b"hello world");
        assert_eq!(trailers.expect("trailers")["checksum"], "9");
        assert!(body.take_reusable().is_some());
    }

    #[tokio::test]
    async fn a_sized_body_ends_at_its_length_and_its_connection_is_reusable() {
        let (read, mut body) = read_body(ResponseFraming::Length(11), b"hello world", false).await;
        assert_eq!(read.expect("reads").0, b"hello world");
        assert!(body.take_reusable().is_some());
    }

    #[tokio::test]
    async fn a_body_until_close_ends_at_the_close_and_is_not_reusable() {
        let (read, mut body) = read_body(ResponseFraming::UntilClose, b"all of it", true).await;
        assert_eq!(read.expect("reads").0, b"all of it");
        assert!(body.take_reusable().is_none());
    }

    #[tokio::test]
    async fn a_body_cut_short_fails_and_its_connection_goes() {
        let (read, mut body) = read_body(ResponseFraming::Length(100), b"only ten..", true).await;
        assert!(matches!(read, Err(H1Error::IncompleteBody)));
        assert!(body.take_reusable().is_none());
        let (read, _) = read_body(ResponseFraming::Chunked, b"5\r\nhel", true).await;
        assert!(matches!(read, Err(H1Error::IncompleteBody)));
    }

    #[tokio::test]
    async fn malformed_chunks_are_refused() {
        for sent in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloXX0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"11111111111111111\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"5\r\r\nhello\r\n0\r\n\r\n",
            b"5\x0c\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\n",
            b"5\r\nhello\r\n0\r\nX: 1\n\nJUNK\r\n\r\n",
        ] {
            let (read, _) = read_body(ResponseFraming::Chunked, sent, true).await;
            assert!(
                matches!(read, Err(H1Error::Malformed(_))),
                "{}",
                String::from_utf8_lossy(sent)
            );
        }
    }

    #[tokio::test]
    async fn bytes_past_the_end_make_the_connection_unusable() {
        let (read, mut body) = read_body(ResponseFraming::Length(2), b"okEXTRA", false).await;
        assert_eq!(read.expect("reads").0, b"ok");
        assert!(body.take_reusable().is_none());
    }
}
