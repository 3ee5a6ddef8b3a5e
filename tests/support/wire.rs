//! A byte stream with a read buffer, for tests that speak HTTP/1.1 by hand on either side of the
//! gateway: read up to a delimiter, an exact length, a chunked body or the end of the stream, and
//! a message head's start line and fields.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::net::TcpStream;

/// A stream (or its read half) and what was read from it but not yet taken. With a bound, a read
/// that waits longer fails the test (a client waiting for the gateway); without one it waits (an
/// upstream connection idle in the gateway's pool).
pub struct Wire<S = TcpStream> {
    pub stream: S,
    pub buffer: Vec<u8>,
    bound: Option<Duration>,
}

impl<S: AsyncRead + Unpin> Wire<S> {
    /// Reads that wait as long as it takes.
    pub fn new(stream: S) -> Wire<S> {
        Wire {
            stream,
            buffer: Vec::new(),
            bound: None,
        }
    }

    /// Reads that fail the test when nothing comes for `bound`.
    pub fn bounded(stream: S, bound: Duration) -> Wire<S> {
        Wire {
            bound: Some(bound),
            ..Wire::new(stream)
        }
    }

    /// Reads more into the buffer; false at the end of the stream (or an error, a reset).
    pub async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        let read = self.stream.read(&mut chunk);
        let read = match self.bound {
            None => read.await,
            Some(bound) => tokio::time::timeout(bound, read).await.unwrap_or_else(|_| {
                panic!(
                    "nothing came for {bound:?}; unread: {:?}",
                    String::from_utf8_lossy(&self.buffer)
                )
            }),
        };
        match read {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Everything up to and including the first `delimiter`; `None` if the stream ends first.
    pub async fn read_until(&mut self, delimiter: &[u8]) -> Option<Vec<u8>> {
        loop {
            if let Some(at) = self
                .buffer
                .windows(delimiter.len())
                .position(|w| w == delimiter)
            {
                return Some(self.buffer.drain(..at + delimiter.len()).collect());
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// Exactly `n` bytes; `Err` with what came if the stream ends first.
    pub async fn read_exact(&mut self, n: usize) -> Result<Vec<u8>, Vec<u8>> {
        while self.buffer.len() < n {
            if !self.fill().await {
                return Err(std::mem::take(&mut self.buffer));
            }
        }
        Ok(self.buffer.drain(..n).collect())
    }

    /// Everything until the peer closes.
    pub async fn read_to_close(&mut self) -> Vec<u8> {
        while self.fill().await {}
        std::mem::take(&mut self.buffer)
    }

    /// A chunked body, decoded (extensions ignored), and its trailer lines; `Err` with the data
    /// decoded so far if the stream ends first or the framing is broken.
    pub async fn read_chunked(&mut self) -> Result<(Vec<u8>, Vec<String>), Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let Some(line) = self.read_until(b"\r\n").await else {
                return Err(body);
            };
            let line = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
            let size = line.split(';').next().unwrap_or_default().trim();
            let Ok(size) = usize::from_str_radix(size, 16) else {
                return Err(body);
            };
            if size == 0 {
                let mut trailers = Vec::new();
                loop {
                    let Some(line) = self.read_until(b"\r\n").await else {
                        return Err(body);
                    };
                    if line == b"\r\n" {
                        return Ok((body, trailers));
                    }
                    trailers.push(String::from_utf8_lossy(&line[..line.len() - 2]).into_owned());
                }
            }
            match self.read_exact(size + 2).await {
                Ok(data) if data.ends_with(b"\r\n") => body.extend_from_slice(&data[..size]),
                Ok(_) => return Err(body),
                Err(rest) => {
                    body.extend_from_slice(&rest[..rest.len().min(size)]);
                    return Err(body);
                }
            }
        }
    }
}

/// A message head as it came on the wire: its start line and its fields, names as written.
#[derive(Debug, Clone)]
pub struct Head {
    pub start: String,
    pub fields: Vec<(String, String)>,
}

impl Head {
    pub fn parse(bytes: &[u8]) -> Head {
        let text = String::from_utf8_lossy(bytes);
        let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
        let start = lines.next().unwrap_or_default().to_owned();
        let fields = lines
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                Some((name.to_owned(), value.trim().to_owned()))
            })
            .collect();
        Head { start, fields }
    }

    /// Every value of the field `name` (any letter case).
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.all(name).first().copied()
    }

    /// The field names as written, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.fields.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        names
    }

    pub fn is_chunked(&self) -> bool {
        self.all("transfer-encoding")
            .iter()
            .any(|v| v.to_ascii_lowercase().contains("chunked"))
    }
}
