//! The body of an HTTP/1 message as it comes off a connection's read buffer: by length, chunk by
//! chunk (with hyper's limits on chunk-size lines, extensions and trailers), or until the peer
//! closes. Frames are slices of the buffer, not copies. The upstream client reads responses with
//! it; the client-facing HTTP/1 server that is to replace hyper's will read requests with it.

use bytes::{Buf as _, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Frame, SizeHint};

/// The longest chunk-size line accepted (size, extensions and line end).
const MAX_CHUNK_LINE: usize = 4096;
/// The most bytes of chunk extensions one body may carry, and the largest trailer section
/// (hyper's limits, 16 KiB each).
const MAX_CHUNK_EXTENSIONS: usize = 16 * 1024;
const MAX_TRAILER_SECTION: usize = 16 * 1024;
/// The most fields a trailer section may carry.
const MAX_TRAILER_FIELDS: usize = 100;

/// How a body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// Exactly this many bytes.
    Length(u64),
    Chunked,
    /// Until the peer closes the connection.
    UntilClose,
}

/// Why a body cannot be read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the body is malformed: {0}")]
    Malformed(&'static str),
    #[error("the connection closed before the end of the body")]
    Incomplete,
}

/// One step of decoding.
#[derive(Debug)]
pub enum Decoded {
    /// Data or trailers.
    Frame(Frame<bytes::Bytes>),
    /// More bytes must be read into the buffer first.
    NeedMore,
    /// The body has ended.
    End,
}

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

/// A body being read.
#[derive(Debug)]
pub struct BodyDecoder {
    state: State,
    /// Bytes of chunk-size lines beyond their digits, so far.
    extension_bytes: usize,
}

impl BodyDecoder {
    pub fn new(framing: BodyFraming) -> BodyDecoder {
        let state = match framing {
            BodyFraming::Length(0) => State::Done,
            BodyFraming::Length(length) => State::Length(length),
            BodyFraming::Chunked => State::ChunkSize,
            BodyFraming::UntilClose => State::UntilClose,
        };
        BodyDecoder {
            state,
            extension_bytes: 0,
        }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    pub fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(left) => SizeHint::with_exact(left),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }

    /// The next step of the body from the start of `buffer`, taking what it uses out of it.
    pub fn decode(&mut self, buffer: &mut BytesMut) -> Result<Decoded, DecodeError> {
        let malformed = |why| Err(DecodeError::Malformed(why));
        loop {
            let buffered = buffer.len();
            match self.state {
                State::Done => return Ok(Decoded::End),
                State::Length(left) | State::ChunkData(left) if buffered > 0 => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(buffered);
                    let data = buffer.split_to(take).freeze();
                    let left = left - take as u64;
                    self.state = match self.state {
                        State::Length(_) if left == 0 => State::Done,
                        State::Length(_) => State::Length(left),
                        _ if left == 0 => State::ChunkEnd,
                        _ => State::ChunkData(left),
                    };
                    return Ok(Decoded::Frame(Frame::data(data)));
                }
                State::UntilClose if buffered > 0 => {
                    return Ok(Decoded::Frame(Frame::data(buffer.split().freeze())));
                }
                State::ChunkSize => {
                    let Some(end) = memchr::memchr(b'\n', buffer) else {
                        if buffered >= MAX_CHUNK_LINE {
                            return malformed("a chunk-size line is too long");
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    if end >= MAX_CHUNK_LINE {
                        return malformed("a chunk-size line is too long");
                    }
                    let (size, extension) = chunk_size(&buffer[..=end])?;
                    self.extension_bytes += extension;
                    if self.extension_bytes > MAX_CHUNK_EXTENSIONS {
                        return malformed("the chunk extensions are too long");
                    }
                    buffer.advance(end + 1);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::ChunkData(size)
                    };
                }
                State::ChunkEnd if buffered >= 2 => {
                    if &buffer[..2] != b"\r\n" {
                        return malformed("a chunk's data is longer than its size");
                    }
                    buffer.advance(2);
                    self.state = State::ChunkSize;
                }
                State::Trailers if buffer.starts_with(b"\n") => {
                    return malformed("a bare line feed ends the chunked body");
                }
                State::Trailers if buffer.starts_with(b"\r\n") => {
                    buffer.advance(2);
                    self.state = State::Done;
                    return Ok(Decoded::End);
                }
                State::Trailers => {
                    let Some(end) = memchr::memmem::find(buffer, b"\r\n\r\n") else {
                        if buffered >= MAX_TRAILER_SECTION {
                            return malformed("the trailer section is too long");
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    let trailers = parse_trailers(&buffer[..end + 4])?;
                    buffer.advance(end + 4);
                    self.state = State::Done;
                    return Ok(Decoded::Frame(Frame::trailers(trailers)));
                }
                _ => return Ok(Decoded::NeedMore),
            }
        }
    }

    /// The peer closed the connection with `decode` wanting more: the end of a body read until
    /// the close, else a body cut short.
    pub fn closed(&mut self) -> Result<(), DecodeError> {
        if self.state == State::UntilClose {
            self.state = State::Done;
            return Ok(());
        }
        Err(DecodeError::Incomplete)
    }
}

/// The size in a chunk-size line (`1a;name=value\r\n`) and the length of what follows its digits:
/// hexadecimal digits, then optional spaces or tabs and extensions (ignored), then CRLF.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), DecodeError> {
    let malformed = || DecodeError::Malformed("a chunk-size line does not parse");
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

/// A chunked body's trailer section, up to and including its empty line.
pub fn parse_trailers(section: &[u8]) -> Result<HeaderMap, DecodeError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
    match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((used, parsed))) if used == section.len() => {
            let mut trailers = HeaderMap::with_capacity(parsed.len());
            for field in parsed {
                let name = HeaderName::from_bytes(field.name.as_bytes())
                    .map_err(|_| DecodeError::Malformed("a trailer name is invalid"))?;
                let value = HeaderValue::from_bytes(field.value)
                    .map_err(|_| DecodeError::Malformed("a trailer value is invalid"))?;
                trailers.append(name, value);
            }
            Ok(trailers)
        }
        _ => Err(DecodeError::Malformed("the trailer section does not parse")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_parse_into_fields() {
        let trailers = parse_trailers(b"Checksum: abc\r\nX-B: 2\r\n\r\n").expect("parses");
        assert_eq!(trailers["checksum"], "abc");
        assert_eq!(trailers["x-b"], "2");
        assert!(parse_trailers(b"no colon\r\n\r\n").is_err());
        assert!(parse_trailers(b"X: 1\n\nJUNK\r\n\r\n").is_err());
    }
}
