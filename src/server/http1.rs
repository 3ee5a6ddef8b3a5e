//! The gateway's HTTP/1 server for one client connection: reads each request head, calls the
//! gateway on the connection's own task, and writes the response head and body back, by hyper's
//! rules (`request_head`, `response_head`, `response_body`); no task, channel or timer per
//! request. Keep-alive, pipelining, `100 Continue` and the drain on shutdown are decided here.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::SystemTime;

use bytes::BytesMut;
use http::{Request, Response, StatusCode, Version};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tower::{Service, ServiceExt};

use super::activity::ConnectionActivity;
use super::drain::DrainWatcher;
use super::http_date::HttpDate;
use super::request_body::{lock, Continue, ReadSide, RequestBody, SharedReadSide};
use super::request_head::{parse_request_head_within, HeadRefused, RequestFraming, RequestHead};
use super::response_body::{BodyCut, BodyEncoder};
use super::response_head::{
    write_response_head, Answering, BodyFraming as ResponseFraming, BodySize, ResponseRefused,
    Status,
};
use crate::body::ProxyBody;
use crate::gateway::Gateway;
use crate::proxy::body_decoder::BodyFraming;
use crate::proxy::extensions::AmbiguousFraming;
use crate::proxy::ClientAddr;

/// Response bytes gathered before they are written even though the body has more ready.
const FLUSH_AT: usize = 64 * 1024;
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Why a connection ended other than by the client closing it between requests.
#[derive(Debug, thiserror::Error)]
pub enum Http1Error {
    #[error("reading from the client failed: {0}")]
    Read(#[source] io::Error),
    #[error("writing to the client failed: {0}")]
    Write(#[source] io::Error),
    #[error("the client closed the connection within a request head")]
    HeadCut,
    #[error(transparent)]
    HeadRefused(#[from] HeadRefused),
    #[error("the gateway's response cannot be written: {0}")]
    ResponseRefused(#[from] ResponseRefused),
    #[error("the response body failed: {0}")]
    ResponseBody(#[source] crate::body::BoxError),
    #[error(transparent)]
    ResponseCut(#[from] BodyCut),
}

/// What a connection is served with, besides its stream.
pub struct Served {
    pub gateway: Gateway,
    pub client: ClientAddr,
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub activity: Arc<ConnectionActivity>,
    pub drain: DrainWatcher,
}

/// One HTTP/1 client connection being served.
pub struct Http1Connection<R, W> {
    read: SharedReadSide<R>,
    write: W,
    gateway: Gateway,
    client: ClientAddr,
    max_head_bytes: usize,
    max_headers: usize,
    activity: Arc<ConnectionActivity>,
    drain: DrainWatcher,
    /// The response being written.
    out: Vec<u8>,
    date: HttpDate,
    /// Requests read so far.
    requests: u64,
}

/// What waiting for the gateway's answer came to.
enum Waited {
    Answer(Response<ProxyBody>),
    /// The client's body was first read: it waits for `100 Continue`.
    Continue,
    ClientGone,
}

impl<R, W> Http1Connection<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// A connection whose first bytes, `buffer`, are already read.
    pub fn new(read: R, write: W, buffer: BytesMut, served: Served) -> Http1Connection<R, W> {
        Http1Connection {
            read: Arc::new(Mutex::new(ReadSide::new(read, buffer))),
            write,
            gateway: served.gateway,
            client: served.client,
            max_head_bytes: served.max_head_bytes,
            max_headers: served.max_headers,
            activity: served.activity,
            drain: served.drain,
            out: Vec::new(),
            date: HttpDate::default(),
            requests: 0,
        }
    }

    /// Serves requests until the client closes, a request or response ends the connection, or
    /// the drain closes it between requests.
    pub async fn serve(mut self) -> Result<(), Http1Error> {
        let draining = self.drain.clone().draining();
        let mut draining = pin!(draining);
        loop {
            let head = match self.next_head(draining.as_mut()).await {
                Ok(Some(head)) => head,
                Ok(None) => {
                    // A TLS client is owed its close_notify; the clock bounds how long this takes.
                    let _ = self.write.shutdown().await;
                    return Ok(());
                }
                Err(Http1Error::HeadRefused(refused)) => {
                    self.refuse(refused).await;
                    return Err(refused.into());
                }
                Err(e) => return Err(e),
            };
            let open = self.exchange(head).await?;
            if !open {
                let _ = self.write.shutdown().await;
                return Ok(());
            }
        }
    }

    /// Reads the next request head: `None` when the client closed (or the drain began) between
    /// requests; the drain closes a connection waiting for one.
    async fn next_head(
        &mut self,
        mut draining: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<RequestHead>, Http1Error> {
        let max = self.max_head_bytes;
        let max_headers = self.max_headers;
        let shared = &self.read;
        let mut drained = self.drain.is_draining();
        poll_fn(|cx| loop {
            let mut side = lock(shared);
            if let Some(head) = parse_request_head_within(&mut side.buffer, max, max_headers)? {
                return Poll::Ready(Ok(Some(head)));
            }
            if !drained && draining.as_mut().poll(cx).is_ready() {
                drained = true;
            }
            if drained {
                return Poll::Ready(Ok(None));
            }
            let room = max.saturating_sub(side.buffer.len()).max(1);
            match std::task::ready!(side.poll_read_more(cx, room)) {
                Ok(0) if side.buffer.iter().all(|b| b.is_ascii_whitespace()) => {
                    return Poll::Ready(Ok(None))
                }
                Ok(0) => return Poll::Ready(Err(Http1Error::HeadCut)),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(Http1Error::Read(e))),
            }
        })
        .await
    }

    /// Answers a head that cannot be served with its bare status; the connection closes.
    async fn refuse(&mut self, refused: HeadRefused) {
        self.bare_answer(refused.status()).await;
    }

    /// Writes a bare `status` (no body, `connection: close`), then closes the connection.
    async fn bare_answer(&mut self, status: StatusCode) {
        self.out.clear();
        let answering = Answering {
            method: &http::Method::GET,
            version: Version::HTTP_11,
            keep_alive: false,
        };
        let date = self.date.at(SystemTime::now());
        let written = write_response_head(
            &mut self.out,
            answering,
            status,
            Version::HTTP_11,
            http::HeaderMap::new(),
            BodySize::Ended,
            date,
        );
        if written.is_ok() {
            let _ = self.flush().await;
            let _ = self.write.shutdown().await;
        }
    }

    /// Serves one request: true if the connection stays open for another.
    async fn exchange(&mut self, head: RequestHead) -> Result<bool, Http1Error> {
        self.requests += 1;
        let number = self.requests;
        let framing = match head.framing {
            RequestFraming::Length(length) => BodyFraming::Length(length),
            RequestFraming::Chunked => BodyFraming::Chunked,
        };
        // As hyper's server: an HTTP/1.0 client is never sent `100 Continue`.
        let expect_continue = head.expect_continue && head.version == Version::HTTP_11;
        lock(&self.read).start_body(number, framing, expect_continue);
        let keep_alive = head.keep_alive && !head.both_lengths;
        let method = head.method.clone();
        let version = head.version;
        let accepts_trailers = head.accepts_trailers;
        let ambiguous = head.both_lengths;
        let mut request =
            head.into_request(RequestBody::new(Arc::clone(&self.read), number, framing));
        request.extensions_mut().insert(self.client.clone());
        if ambiguous {
            request.extensions_mut().insert(AmbiguousFraming);
        }
        let open = self.activity.open_request();
        let response = match ServiceExt::<Request<RequestBody<R>>>::ready(&mut self.gateway).await {
            Ok(gateway) => gateway.call(request),
            Err(never) => match never {},
        };
        let Some(response) = self.answer(response, expect_continue).await? else {
            // The client closed while the gateway was at work: the request is dropped with it.
            return Ok(false);
        };
        // A body the gateway dropped unread is skipped if it has all arrived, else the answer
        // says that the connection closes (hyper's rule).
        let skipped = poll_fn(|cx| Poll::Ready(lock(&self.read).skip_dropped_body(cx))).await;
        let answering = Answering {
            method: &method,
            version,
            keep_alive: keep_alive && skipped && !self.drain.is_draining(),
        };
        let last = self.respond(answering, response, accepts_trailers).await?;
        drop(open);
        let reusable = lock(&self.read).take_back();
        Ok(!last && reusable)
    }

    /// Waits for the gateway's answer, meanwhile sending `100 Continue` when a waiting client's
    /// body is first read, and reading ahead once the request's body has ended: `None` if the
    /// client closed first.
    async fn answer(
        &mut self,
        response: impl Future<Output = Result<Response<ProxyBody>, Infallible>>,
        expect_continue: bool,
    ) -> Result<Option<Response<ProxyBody>>, Http1Error> {
        let mut response = pin!(response);
        let limit = self.max_head_bytes;
        let mut answered = None;
        loop {
            let shared = &self.read;
            let step = poll_fn(|cx| {
                if answered.is_none() {
                    if let Poll::Ready(answer) = response.as_mut().poll(cx) {
                        answered = Some(match answer {
                            Ok(response) => response,
                            Err(never) => match never {},
                        });
                    }
                }
                if expect_continue {
                    // Also when the answer is ready: a body it read first is owed its 100 first.
                    let mut side = lock(shared);
                    side.set_loop_waker(cx.waker());
                    if side.expect == Continue::Wanted {
                        side.expect = Continue::NotWaiting;
                        return Poll::Ready(Waited::Continue);
                    }
                }
                if let Some(response) = answered.take() {
                    return Poll::Ready(Waited::Answer(response));
                }
                if lock(shared).poll_client_gone(cx, limit).is_ready() {
                    return Poll::Ready(Waited::ClientGone);
                }
                Poll::Pending
            })
            .await;
            match step {
                Waited::Answer(response) => return Ok(Some(response)),
                Waited::ClientGone => return Ok(None),
                Waited::Continue => {
                    self.write
                        .write_all(CONTINUE)
                        .await
                        .map_err(Http1Error::Write)?;
                    self.write.flush().await.map_err(Http1Error::Write)?;
                }
            }
        }
    }

    /// Writes `response`: true if the connection closes after it.
    async fn respond(
        &mut self,
        answering: Answering<'_>,
        response: Response<ProxyBody>,
        accepts_trailers: bool,
    ) -> Result<bool, Http1Error> {
        let (parts, mut body) = response.into_parts();
        let size = if body.is_end_stream() {
            BodySize::Ended
        } else {
            match body.size_hint().exact() {
                Some(length) => BodySize::Known(length),
                None => BodySize::Unknown,
            }
        };
        let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>();
        let status = Status {
            code: parts.status,
            reason: reason.map(|reason| reason.as_bytes()),
        };
        self.out.clear();
        let date = self.date.at(SystemTime::now());
        let written = match write_response_head(
            &mut self.out,
            answering,
            status,
            parts.version,
            parts.headers,
            size,
            date,
        ) {
            Ok(written) => written,
            Err(ResponseRefused::Informational) => {
                // hyper's server answers a 1xx final response with a bare 500 and closes.
                self.bare_answer(StatusCode::INTERNAL_SERVER_ERROR).await;
                return Err(ResponseRefused::Informational.into());
            }
            Err(refused) => return Err(refused.into()),
        };
        let mut encoder = BodyEncoder::new(written.framing, written.trailers, accepts_trailers);
        if size != BodySize::Ended {
            self.write_body(&mut body, &mut encoder, written.framing)
                .await?;
        }
        drop(body);
        encoder.end(&mut self.out)?;
        self.flush().await?;
        Ok(written.last)
    }

    /// Writes the body's frames as they come, gathered while more are ready.
    async fn write_body(
        &mut self,
        body: &mut ProxyBody,
        encoder: &mut BodyEncoder,
        framing: ResponseFraming,
    ) -> Result<(), Http1Error> {
        // A body framed by length ends at its length, whatever else it would send.
        let by_length = matches!(framing, ResponseFraming::Length(_));
        loop {
            if by_length && encoder.is_done() {
                return Ok(());
            }
            let out = &self.out;
            let next = poll_fn(|cx| match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending if !out.is_empty() => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
                Poll::Ready(frame) => Poll::Ready(Some(frame)),
            })
            .await;
            match next {
                None => self.flush().await?,
                Some(None) => return Ok(()),
                Some(Some(Ok(frame))) => {
                    match frame.into_data() {
                        Ok(data) => encoder.data(&data, &mut self.out),
                        Err(frame) => {
                            if let Ok(trailers) = frame.into_trailers() {
                                encoder.trailers(trailers, &mut self.out);
                            }
                        }
                    }
                    if self.out.len() >= FLUSH_AT {
                        self.flush().await?;
                    }
                }
                Some(Some(Err(e))) => return Err(Http1Error::ResponseBody(e)),
            }
        }
    }

    /// Writes what is gathered, and flushes it: a TLS session may hold written bytes until it is
    /// flushed (a TCP socket's flush does nothing).
    async fn flush(&mut self) -> Result<(), Http1Error> {
        if !self.out.is_empty() {
            self.write
                .write_all(&self.out)
                .await
                .map_err(Http1Error::Write)?;
            self.out.clear();
        }
        self.write.flush().await.map_err(Http1Error::Write)
    }
}

impl<R, W> Drop for Http1Connection<R, W> {
    /// However the connection ends, a request body still held somewhere (by a task the gateway
    /// spawned) fails from now on and no longer holds the client's socket open.
    fn drop(&mut self) {
        lock(&self.read).close();
    }
}
