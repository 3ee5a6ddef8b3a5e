//! A response body read straight off its upstream connection: by length, chunk by chunk, or
//! until the upstream closes. Frames are slices of the connection's read buffer, not copies.
//! Read to its end, it gives its connection back if another exchange may use it.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::connection::{H1Connection, Upload};
use super::head::ResponseFraming;
use super::H1Error;
use crate::proxy::body_decoder::{BodyDecoder, Decoded};

/// A response body on its connection.
pub struct H1Body {
    connection: Option<H1Connection>,
    decoder: BodyDecoder,
    /// Whether the connection may carry another exchange once this body has ended.
    reusable: bool,
    /// The rest of a request body still being sent (the response came first).
    upload: Option<Box<Upload>>,
}

impl H1Body {
    pub(super) fn new(
        connection: H1Connection,
        framing: ResponseFraming,
        reusable: bool,
        upload: Option<Box<Upload>>,
    ) -> H1Body {
        H1Body {
            connection: Some(connection),
            decoder: BodyDecoder::new(framing),
            reusable: reusable && framing != ResponseFraming::UntilClose,
            upload,
        }
    }

    /// The connection, once the body has ended, if the upstream keeps it open and sent nothing
    /// past the body's end.
    pub fn take_reusable(&mut self) -> Option<H1Connection> {
        if !self.decoder.is_done() || !self.reusable {
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
            match self.decoder.decode(&mut connection.read)? {
                Decoded::Frame(frame) => return Poll::Ready(Some(Ok(frame))),
                Decoded::End => return Poll::Ready(None),
                Decoded::NeedMore => {}
            }
            if ready!(connection.poll_read_more(cx))? == 0 {
                self.decoder.closed()?;
                // Read until the close: the connection is gone.
                self.reusable = false;
                return Poll::Ready(None);
            }
        }
    }
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
            this.reusable = false;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.size_hint()
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
