//! The client's request body as the gateway reads it: the server's stream (hyper's, or any body
//! a server hands the gateway), with its failures told apart from the upstream's (a malformed or cut-off body is the client's fault: 400) and a
//! bound on how long it may pause between two pieces (`[server] body_timeout`: 408).

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::body::{BoxError, RequestBody};
use crate::error::GatewayError;

/// The client's body failed: bad chunked framing, or the connection closed before its end.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body failed: {0}")]
pub struct ClientBodyFailed(#[source] BoxError);

/// The client's body paused for longer than `body_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body paused for longer than {after:?}")]
pub struct ClientBodyStalled {
    pub after: Duration,
}

/// The server's incoming body with a pause bound.
pub struct ClientStream<B> {
    incoming: B,
    pause: Duration,
    /// Armed when a read finds nothing ready; disarmed by the next piece.
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl<B> ClientStream<B> {
    pub fn new(incoming: B, pause: Duration) -> ClientStream<B> {
        ClientStream {
            incoming,
            pause,
            timer: None,
            armed: false,
        }
    }
}

impl<B> Body for ClientStream<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.incoming).poll_frame(cx) {
            Poll::Ready(polled) => {
                this.armed = false;
                Poll::Ready(polled.map(|frame| {
                    frame.map_err(|e| -> BoxError { Box::new(ClientBodyFailed(e.into())) })
                }))
            }
            Poll::Pending => {
                let pause = this.pause;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
                if !this.armed {
                    timer.as_mut().reset(Instant::now() + pause);
                    this.armed = true;
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        Poll::Ready(Some(Err(Box::new(ClientBodyStalled { after: this.pause }))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

/// The client's fault in `error` (or an error it wraps), as the answer it gets: 400 for a
/// malformed or cut-off body, 408 for a stalled one.
pub fn client_body_fault(error: &(dyn std::error::Error + 'static)) -> Option<GatewayError> {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<ClientBodyFailed>() {
            return Some(GatewayError::ClientBody);
        }
        if let Some(stalled) = e.downcast_ref::<ClientBodyStalled>() {
            return Some(GatewayError::BodyTimeout {
                after: stalled.after,
            });
        }
        current = e.source();
    }
    None
}

/// The client's body, streamed into a [`RequestBody`]; failing if it pauses for longer than
/// `pause`.
pub fn streamed_body<B>(incoming: B, pause: Duration) -> RequestBody
where
    B: Body<Data = Bytes> + Send + Sync + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    use http_body_util::BodyExt as _;
    RequestBody::unlimited(ClientStream::new(incoming, pause).boxed())
}
