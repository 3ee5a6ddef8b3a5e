//! Follows the framing of the HTTP/1 requests on one connection from its raw bytes, head, body,
//! head, the way hyper reads them, to number the heads that carry both `Content-Length` and
//! `Transfer-Encoding`: hyper resolves that conflict silently (it drops the length), so the
//! gateway has to see it here to refuse it.

/// Where the scanner is in the connection's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a request head (leading blank lines skipped, as hyper does).
    Head,
    /// Skipping a body of this many more bytes.
    Fixed(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// No longer following: the connection is not (or no longer) plain HTTP/1 requests whose
    /// framing the scanner agrees on with hyper — HTTP/2, an upgrade, a head hyper will refuse,
    /// or after a conflict (hyper closes the connection after that request).
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// The chunk-size line: hex digits, then extensions up to the line feed.
    Size {
        value: u64,
        digits: u8,
        extension: bool,
    },
    /// Chunk data still to skip.
    Data(u64),
    /// The line end after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk, up to an empty line; `blank` while the current line
    /// holds nothing but a carriage return.
    Trailer { blank: bool },
}

/// How a head says its body is framed.
enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Both headers: the head the gateway refuses.
    Conflict,
    /// Anything the scanner does not follow further.
    Unfollowable,
}

/// The framing scanner of one connection's request bytes.
#[derive(Debug)]
pub struct FramingScanner {
    state: State,
    /// The part of a head that arrived in earlier reads.
    partial_head: Vec<u8>,
    heads: u64,
    max_head_bytes: usize,
}

impl FramingScanner {
    /// A scanner for a new connection; a head longer than `max_head_bytes` (hyper refuses it)
    /// stops the scanner.
    pub fn new(max_head_bytes: usize) -> FramingScanner {
        FramingScanner {
            state: State::Head,
            partial_head: Vec::new(),
            heads: 0,
            max_head_bytes,
        }
    }

    /// Takes the next bytes read from the client. Returns the 1-based number, on this
    /// connection, of a request head in them that carries both `Content-Length` and
    /// `Transfer-Encoding`; the scanner stops after it.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Option<u64> {
        while !bytes.is_empty() {
            match self.state {
                State::Stopped => return None,
                State::Head => {
                    let (used, conflict) = self.read_head(bytes);
                    bytes = &bytes[used..];
                    if conflict.is_some() {
                        return conflict;
                    }
                }
                State::Fixed(left) => {
                    let skip = usize::try_from(left).map_or(bytes.len(), |l| l.min(bytes.len()));
                    bytes = &bytes[skip..];
                    let left = left - skip as u64;
                    self.state = if left == 0 {
                        State::Head
                    } else {
                        State::Fixed(left)
                    };
                }
                State::Chunked(chunk) => {
                    let used = self.read_chunked(chunk, bytes);
                    bytes = &bytes[used..];
                }
            }
        }
        None
    }

    /// Consumes head bytes; returns how many were used and a conflict's head number.
    fn read_head(&mut self, bytes: &[u8]) -> (usize, Option<u64>) {
        let mut start = 0;
        if self.partial_head.is_empty() {
            start = bytes
                .iter()
                .position(|&b| b != b'\r' && b != b'\n')
                .unwrap_or(bytes.len());
        }
        let rest = &bytes[start..];
        let Some(end) = self.head_end(rest) else {
            self.partial_head.extend_from_slice(rest);
            if self.partial_head.len() > self.max_head_bytes {
                self.stop();
            }
            return (bytes.len(), None);
        };
        let framing = if self.partial_head.is_empty() {
            framing_of(&rest[..end])
        } else {
            self.partial_head.extend_from_slice(&rest[..end]);
            let framing = framing_of(&self.partial_head);
            self.partial_head.clear();
            framing
        };
        self.heads += 1;
        let used = start + end;
        match framing {
            Framing::None => self.state = State::Head,
            Framing::Length(0) => self.state = State::Head,
            Framing::Length(n) => self.state = State::Fixed(n),
            Framing::Chunked => {
                self.state = State::Chunked(Chunk::Size {
                    value: 0,
                    digits: 0,
                    extension: false,
                })
            }
            Framing::Conflict => {
                self.stop();
                return (used, Some(self.heads));
            }
            Framing::Unfollowable => self.stop(),
        }
        (used, None)
    }

    /// The index in `bytes` just past the blank line ending the head begun in `partial_head`.
    fn head_end(&self, bytes: &[u8]) -> Option<usize> {
        let before = |at: usize, back: usize| -> Option<u8> {
            if at >= back {
                Some(bytes[at - back])
            } else {
                let from_end = back - at;
                self.partial_head
                    .len()
                    .checked_sub(from_end)
                    .map(|i| self.partial_head[i])
            }
        };
        memchr::memchr_iter(b'\n', bytes)
            .find(|&at| {
                let back = if before(at, 1) == Some(b'\r') { 2 } else { 1 };
                before(at, back) == Some(b'\n')
            })
            .map(|at| at + 1)
    }

    /// Consumes chunked-body bytes from `bytes`; returns how many.
    fn read_chunked(&mut self, chunk: Chunk, bytes: &[u8]) -> usize {
        match chunk {
            Chunk::Size {
                mut value,
                mut digits,
                mut extension,
            } => {
                for (i, &b) in bytes.iter().enumerate() {
                    if b == b'\n' {
                        self.state = match (digits, value) {
                            (0, _) => State::Stopped,
                            (_, 0) => State::Chunked(Chunk::Trailer { blank: true }),
                            (_, n) => State::Chunked(Chunk::Data(n)),
                        };
                        return i + 1;
                    }
                    match (extension, hex_value(b)) {
                        (false, Some(digit)) => {
                            // 16 hex digits fill a u64; hyper refuses a longer size.
                            if digits == 16 {
                                self.stop();
                                return bytes.len();
                            }
                            value = value * 16 + u64::from(digit);
                            digits += 1;
                        }
                        _ => extension = true,
                    }
                }
                self.state = State::Chunked(Chunk::Size {
                    value,
                    digits,
                    extension,
                });
                bytes.len()
            }
            Chunk::Data(left) => {
                let skip = usize::try_from(left).map_or(bytes.len(), |l| l.min(bytes.len()));
                let left = left - skip as u64;
                self.state = State::Chunked(if left == 0 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left)
                });
                skip
            }
            Chunk::DataEnd => match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.state = State::Chunked(Chunk::Size {
                        value: 0,
                        digits: 0,
                        extension: false,
                    });
                    i + 1
                }
                None => bytes.len(),
            },
            Chunk::Trailer { mut blank } => {
                for (i, &b) in bytes.iter().enumerate() {
                    match b {
                        b'\n' if blank => {
                            self.state = State::Head;
                            return i + 1;
                        }
                        b'\n' => blank = true,
                        b'\r' => {}
                        _ => blank = false,
                    }
                }
                self.state = State::Chunked(Chunk::Trailer { blank });
                bytes.len()
            }
        }
    }

    fn stop(&mut self) {
        self.state = State::Stopped;
        self.partial_head = Vec::new();
    }
}

fn hex_value(b: u8) -> Option<u8> {
    (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// Reads the framing headers of one complete head (request line to blank line).
fn framing_of(head: &[u8]) -> Framing {
    let mut lines = Lines { rest: Some(head) }.map(trim_cr);
    let request_line = lines.next().unwrap_or_default();
    // `CONNECT` turns the connection into a tunnel; `PRI` is HTTP/2's preface.
    if request_line.starts_with(b"CONNECT ") || request_line.starts_with(b"PRI ") {
        return Framing::Unfollowable;
    }
    let mut length: Option<u64> = None;
    let mut chunked: Option<bool> = None;
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some(colon) = memchr::memchr(b':', line) else {
            return Framing::Unfollowable;
        };
        let (name, value) = (&line[..colon], trim_ows(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            if chunked.is_some() {
                // After a transfer coding hyper ignores the length, whatever its value.
                length = Some(0);
                continue;
            }
            match parse_length(value) {
                Some(n) if length.is_none_or(|prev| prev == n) => length = Some(n),
                // hyper refuses a malformed length, or two different ones.
                _ => return Framing::Unfollowable,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = Some(last_coding_is_chunked(value));
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            return Framing::Unfollowable;
        }
    }
    match (chunked, length) {
        (Some(_), Some(_)) => Framing::Conflict,
        (Some(true), None) => Framing::Chunked,
        (Some(false), None) => Framing::Unfollowable,
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::None,
    }
}

/// The lines of a head, split at line feeds (found with `memchr`: this runs on every request).
struct Lines<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        match memchr::memchr(b'\n', rest) {
            Some(at) => {
                self.rest = Some(&rest[at + 1..]);
                Some(&rest[..at])
            }
            None => self.rest.take(),
        }
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

fn parse_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

fn last_coding_is_chunked(value: &[u8]) -> bool {
    let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
    trim_ows(last).eq_ignore_ascii_case(b"chunked")
}

#[cfg(test)]
mod tests {
    use super::FramingScanner;

    const LIMIT: usize = 64 * 1024;

    fn conflicts(stream: &[u8]) -> Option<u64> {
        FramingScanner::new(LIMIT).feed(stream)
    }

    /// Feeds `stream` in pieces of `size` bytes.
    fn conflicts_in_pieces(stream: &[u8], size: usize) -> Option<u64> {
        let mut scanner = FramingScanner::new(LIMIT);
        stream.chunks(size).find_map(|piece| scanner.feed(piece))
    }

    const BOTH: &[u8] =
        b"POST /a HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    const BOTH_REVERSED: &[u8] =
        b"POST /a HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n";

    #[test]
    fn both_headers_in_either_order_are_a_conflict_on_the_first_head() {
        assert_eq!(conflicts(BOTH), Some(1));
        assert_eq!(conflicts(BOTH_REVERSED), Some(1));
    }

    #[test]
    fn heads_after_bodies_of_each_framing_are_numbered_in_order() {
        let mut stream = b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        stream.extend_from_slice(b"POST /2 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
        stream.extend_from_slice(
            b"POST /3 HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n",
        );
        stream.extend_from_slice(b"\r\n");
        stream.extend_from_slice(BOTH);
        for size in [1, 2, 3, 7, stream.len()] {
            assert_eq!(
                conflicts_in_pieces(&stream, size),
                Some(4),
                "pieces of {size}"
            );
        }
    }

    #[test]
    fn header_text_inside_a_body_is_not_a_head() {
        let hidden = BOTH;
        let mut stream = format!(
            "POST /1 HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            hidden.len()
        )
        .into_bytes();
        stream.extend_from_slice(hidden);
        assert_eq!(conflicts(&stream), None);
        let mut chunked = b"POST /1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        chunked.extend_from_slice(format!("{:x}\r\n", hidden.len()).as_bytes());
        chunked.extend_from_slice(hidden);
        chunked.extend_from_slice(b"\r\n0\r\n\r\n");
        for size in [1, 5, chunked.len()] {
            assert_eq!(
                conflicts_in_pieces(&chunked, size),
                None,
                "pieces of {size}"
            );
        }
    }

    #[test]
    fn bare_line_feeds_end_lines_and_heads() {
        assert_eq!(
            conflicts(b"POST /a HTTP/1.1\nContent-Length: 1\nTransfer-Encoding: chunked\n\n"),
            Some(1)
        );
    }

    #[test]
    fn one_length_or_one_coding_alone_is_no_conflict() {
        assert_eq!(
            conflicts(b"POST /a HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"),
            None
        );
        assert_eq!(
            conflicts(b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
            None
        );
    }

    #[test]
    fn the_scanner_stops_where_it_cannot_follow_the_stream() {
        for stream in [
            // HTTP/2 with prior knowledge.
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            b"CONNECT host:443 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n11111111111111111\r\n",
        ] {
            let mut follow = stream.to_vec();
            follow.extend_from_slice(BOTH);
            assert_eq!(
                conflicts(&follow),
                None,
                "{:?}",
                String::from_utf8_lossy(stream)
            );
        }
    }

    #[test]
    fn an_oversized_head_stops_the_scanner() {
        let mut scanner = FramingScanner::new(32);
        assert_eq!(scanner.feed(b"POST /a HTTP/1.1\r\nX-Long: "), None);
        assert_eq!(scanner.feed(&[b'a'; 40]), None);
        assert_eq!(
            scanner.feed(b"\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            None
        );
    }

    #[test]
    fn nothing_is_found_after_the_first_conflict() {
        let mut scanner = FramingScanner::new(LIMIT);
        assert_eq!(scanner.feed(BOTH), Some(1));
        assert_eq!(scanner.feed(BOTH), None);
    }
}
