//! The gateway's own HTTP/1.1 client for one upstream connection, driven from the request's own
//! future: no connection task, no channel between them. It writes a request (head and body),
//! reads the response head, and hands back a body that reads the rest from the same socket and
//! says, once read to its end, whether the connection may carry another exchange.

mod body;
mod connection;
mod head;
mod request;

pub use body::H1Body;
pub use connection::H1Connection;

use http::{Request, Response};

use crate::body::BoxError;
use crate::body::RequestBody;

impl H1Connection {
    /// Sends `request` (origin-form URI) and reads its response's head. The body reads the rest
    /// from this connection and, read to its end, gives it back through
    /// [`H1Body::take_reusable`] if the upstream keeps it open.
    pub async fn send(self, request: Request<RequestBody>) -> Result<Response<H1Body>, H1Error> {
        let response = self.send_head(request).await?;
        Ok(response.map(|unread| {
            H1Body::new(
                unread.connection,
                unread.framing,
                unread.reusable,
                unread.upload,
            )
        }))
    }
}

/// The largest response head accepted (what hyper's client buffers at most, 8 KiB + 100 × 4 KiB).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// The most header fields a response head (or a chunked body's trailers) may carry (hyper's
/// client limit).
pub const MAX_RESPONSE_HEADERS: usize = 100;

/// Why an exchange on an upstream connection failed. The connection is never used again.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    #[error("writing to the upstream failed: {0}")]
    Write(#[source] std::io::Error),
    #[error("reading from the upstream failed: {0}")]
    Read(#[source] std::io::Error),
    /// The client's body (or the gateway's copy of it) failed while it was being sent.
    #[error("the request body failed: {0}")]
    RequestBody(#[source] BoxError),
    /// The request body yielded more or fewer bytes than its `Content-Length` said.
    #[error("the request body's length differs from its Content-Length ({declared} bytes)")]
    RequestBodyLength { declared: u64 },
    #[error("the upstream closed the connection before a complete response head")]
    ClosedBeforeResponse,
    #[error("the upstream closed the connection before the end of the response body")]
    IncompleteBody,
    #[error("the upstream's response head is larger than {MAX_RESPONSE_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// The response breaks HTTP/1.1's framing or syntax rules (RFC 9112).
    #[error("the upstream's response is malformed: {0}")]
    Malformed(&'static str),
}

impl From<crate::proxy::body_decoder::DecodeError> for H1Error {
    fn from(error: crate::proxy::body_decoder::DecodeError) -> H1Error {
        use crate::proxy::body_decoder::DecodeError;
        match error {
            DecodeError::Malformed(why) => H1Error::Malformed(why),
            DecodeError::Incomplete => H1Error::IncompleteBody,
        }
    }
}
