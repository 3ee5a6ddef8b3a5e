//! A response body written to a client, for the gateway's own HTTP/1 server (issue 37): the bytes
//! hyper's server writes for each frame, by the framing the head chose — a length (longer bodies
//! cut to it, a shorter one an error), chunks (with the trailers the head declared, when the
//! client accepts them), or until the connection closes.

use http::header::{self, HeaderMap, HeaderName};

use super::response_head::BodyFraming;

/// Trailer fields never sent, whatever the head declared (hyper's list).
const NEVER_TRAILERS: [HeaderName; 12] = [
    header::AUTHORIZATION,
    header::CACHE_CONTROL,
    header::CONTENT_ENCODING,
    header::CONTENT_LENGTH,
    header::CONTENT_RANGE,
    header::CONTENT_TYPE,
    header::HOST,
    header::MAX_FORWARDS,
    header::SET_COOKIE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::TE,
];

/// The body ended before the length its head announced; the connection must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the response body ended {missing} bytes short of its length")]
pub struct BodyCut {
    pub missing: u64,
}

/// One response body being written.
#[derive(Debug)]
pub struct BodyEncoder {
    framing: BodyFraming,
    /// The trailer fields that may be sent: declared by the head, accepted by the client.
    trailers: Option<Vec<HeaderName>>,
    /// The chunked body's last chunk has been written (with trailers).
    ended: bool,
}

impl BodyEncoder {
    /// A body framed as `framing`; `trailers` are the fields the head declared, sent only if
    /// `accepts_trailers` (the request's `TE: trailers`).
    pub fn new(
        framing: BodyFraming,
        trailers: Option<Vec<HeaderName>>,
        accepts_trailers: bool,
    ) -> BodyEncoder {
        BodyEncoder {
            framing,
            trailers: trailers.filter(|_| accepts_trailers),
            ended: false,
        }
    }

    /// Whether the body has had all it may carry (a length reached, or the last chunk written).
    pub fn is_done(&self) -> bool {
        self.ended || self.framing == BodyFraming::Length(0)
    }

    /// Appends a data frame: empty frames and data past a length are dropped.
    pub fn data(&mut self, data: &[u8], dst: &mut Vec<u8>) {
        if data.is_empty() || self.is_done() {
            return;
        }
        match &mut self.framing {
            BodyFraming::Length(left) => {
                let take = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                dst.extend_from_slice(&data[..take]);
                *left -= take as u64;
            }
            BodyFraming::Chunked => {
                dst.extend_from_slice(format!("{:X}\r\n", data.len()).as_bytes());
                dst.extend_from_slice(data);
                dst.extend_from_slice(b"\r\n");
            }
            BodyFraming::UntilClose => dst.extend_from_slice(data),
        }
    }

    /// Appends the trailers, where the head declared them and the client accepts them: the last
    /// chunk, the fields declared (less those never sent), the empty line. Anything else drops
    /// them.
    pub fn trailers(&mut self, trailers: HeaderMap, dst: &mut Vec<u8>) {
        if self.is_done() || self.framing != BodyFraming::Chunked {
            return;
        }
        let Some(declared) = &self.trailers else {
            return;
        };
        let mut fields = Vec::new();
        let mut current = None;
        for (name, value) in trailers {
            if let Some(name) = name {
                current = Some(name);
            }
            let Some(name) = &current else {
                continue;
            };
            if declared.contains(name) && !NEVER_TRAILERS.contains(name) {
                fields.extend_from_slice(name.as_str().as_bytes());
                fields.extend_from_slice(b": ");
                fields.extend_from_slice(value.as_bytes());
                fields.extend_from_slice(b"\r\n");
            }
        }
        if fields.is_empty() {
            return;
        }
        dst.extend_from_slice(b"0\r\n");
        dst.extend_from_slice(&fields);
        dst.extend_from_slice(b"\r\n");
        self.ended = true;
    }

    /// Appends the end of the body: the last chunk, unless trailers ended it. A body shorter than
    /// its length is cut: the connection must close.
    pub fn end(&mut self, dst: &mut Vec<u8>) -> Result<(), BodyCut> {
        match self.framing {
            BodyFraming::Length(0) | BodyFraming::UntilClose => Ok(()),
            BodyFraming::Length(missing) => Err(BodyCut { missing }),
            BodyFraming::Chunked if self.ended => Ok(()),
            BodyFraming::Chunked => {
                dst.extend_from_slice(b"0\r\n\r\n");
                self.ended = true;
                Ok(())
            }
        }
    }
}
