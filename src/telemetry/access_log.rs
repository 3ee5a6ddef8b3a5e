//! The access log: one line per request (target `fencegate::access`, level info) — the client
//! and its request, route, key, token, verdict, status, times, bytes both ways, upstream, request
//! id — written, and the request's span ended, when the response body has been sent (or
//! abandoned), as structured fields or as nginx's `combined` line. The layers note what they
//! learn in the request's [`AccessNote`]; refusals and server errors are always written, the rest
//! as sampled.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;

use super::{RequestSpan, SpanFields};
use crate::body::{BoxError, ProxyBody};
use crate::config::AccessLogFormat;

/// How a request ended, as the access log names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Fence checked and passed; forwarded.
    Admitted,
    /// Nothing to check (a read, or a route without a fence); forwarded.
    Unfenced,
    /// An idempotent repeat answered from the recorded outcome, not forwarded.
    Replayed,
    /// Observe mode: the fence would refuse it; forwarded.
    Observed,
    /// The store failed on a fail-open route; forwarded unchecked.
    FailedOpen,
    /// A claim through `/_fencegate/claim/`: the mark raised before the holder's first write.
    Claimed,
    /// Refused by the gateway (a problem document).
    Refused,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Admitted => "admitted",
            Verdict::Unfenced => "unfenced",
            Verdict::Replayed => "replayed",
            Verdict::Observed => "observed",
            Verdict::FailedOpen => "failed_open",
            Verdict::Claimed => "claimed",
            Verdict::Refused => "refused",
        }
    }
}

/// What the layers learned about one request (a request extension, shared with the line).
#[derive(Clone, Default)]
pub struct AccessNote(Arc<NoteCell>);

#[derive(Default)]
struct NoteCell {
    noted: Mutex<Noted>,
    /// Request body bytes read from the client.
    received: AtomicU64,
}

#[derive(Default)]
struct Noted {
    route: Option<String>,
    /// The route trusts the client's `X-Forwarded-For`: the line shows the chain.
    trusts_forwarded: bool,
    key: Option<String>,
    token: Option<u64>,
    verdict: Option<Verdict>,
    reason: Option<&'static str>,
    upstream: Option<Duration>,
    /// The upstream's `host:port` the request was forwarded to.
    upstream_addr: Option<String>,
}

impl AccessNote {
    fn with(&self, note: impl FnOnce(&mut Noted)) {
        // A poisoned note still holds whatever was written before the panic.
        let mut noted = match self.0.noted.lock() {
            Ok(noted) => noted,
            Err(poisoned) => poisoned.into_inner(),
        };
        note(&mut noted);
    }

    /// The route the request matched, and whether it trusts the client's forwarding headers.
    pub fn route(&self, name: &str, trusts_forwarded: bool) {
        self.with(|n| {
            n.route = Some(name.to_owned());
            n.trusts_forwarded = trusts_forwarded;
        });
    }

    /// The resource key and token the fence read.
    pub fn key_and_token(&self, key: &str, token: u64) {
        self.with(|n| {
            n.key = Some(key.to_owned());
            n.token = Some(token);
        });
    }

    /// How the request was let through (or answered) by a layer.
    pub fn verdict(&self, verdict: Verdict) {
        self.with(|n| n.verdict = Some(verdict));
    }

    /// The request was refused: `reason` is the problem type's slug.
    pub fn refused(&self, reason: &'static str) {
        self.with(|n| {
            n.verdict = Some(Verdict::Refused);
            n.reason = Some(reason);
        });
    }

    /// The request was let through but failed past the gateway's checks (the upstream timed out,
    /// refused, reset): the verdict stays what the checks decided, `reason` says what failed.
    pub fn failed(&self, reason: &'static str) {
        self.with(|n| n.reason = Some(reason));
    }

    /// The upstream (`host:port`) the request was sent to, and how long it took to answer the
    /// head (or to fail).
    pub fn upstream(&self, addr: &str, took: Duration) {
        self.with(|n| {
            n.upstream_addr = Some(addr.to_owned());
            n.upstream = Some(took);
        });
    }

    fn received(&self, bytes: usize) {
        self.0.received.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// A client's request body that counts its bytes in the request's note as they are read.
pub struct ReceivedBody<B> {
    inner: B,
    note: Option<AccessNote>,
}

impl<B> ReceivedBody<B> {
    /// `body`, counted in `note` when there is one.
    pub fn new(inner: B, note: Option<AccessNote>) -> ReceivedBody<B> {
        ReceivedBody { inner, note }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for ReceivedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(note)) = (&polled, &self.note) {
            if let Some(data) = frame.data_ref() {
                note.received(data.len());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The access log's settings: whether it is on, which fraction of ordinary lines it keeps, and
/// the lines' shape.
pub struct AccessLog {
    /// Lines kept out of every 2^32 (refusals and 5xx always).
    keep_per_2_32: u64,
    seen: AtomicU64,
    format: AccessLogFormat,
}

impl AccessLog {
    /// `sample` from 0.0 (only refusals and errors) to 1.0 (every request).
    pub fn new(sample: f64, format: AccessLogFormat) -> AccessLog {
        let keep = (sample.clamp(0.0, 1.0) * 4_294_967_296.0).round();
        AccessLog {
            // In range by the clamp: 0 ..= 2^32.
            keep_per_2_32: keep as u64,
            seen: AtomicU64::new(0),
            format,
        }
    }

    /// Whether this ordinary line is kept: exactly `sample` of them, spread evenly (the n-th
    /// line is kept when the running share crosses an integer), with no random source.
    fn keeps(&self) -> bool {
        if self.keep_per_2_32 >= 1 << 32 {
            return true;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        let before = n.wrapping_mul(self.keep_per_2_32) >> 32;
        let after = (n + 1).wrapping_mul(self.keep_per_2_32) >> 32;
        after != before
    }
}

/// One request's record until its response is known: its access line and its span. Dropped
/// without a response (the client left, a timeout or shutdown ended the request before its
/// head), it still writes its line, with no status.
pub struct AccessEntry {
    parts: Option<EntryParts>,
}

pub(super) struct EntryParts {
    pub log: Option<Arc<AccessLog>>,
    pub span: Option<RequestSpan>,
    pub note: AccessNote,
    pub method: Method,
    pub path: String,
    pub request_id: String,
    pub trace_id: Option<String>,
    pub started: Instant,
    pub client: Client,
}

/// Who sent the request, as its head and connection say.
#[derive(Default)]
pub(super) struct Client {
    /// The connection's peer address.
    pub addr: Option<IpAddr>,
    pub host: Option<String>,
    pub version: Version,
    pub user_agent: Option<String>,
    pub referer: Option<String>,
    /// The client's `X-Forwarded-For`, shown only on a route that trusts it.
    pub forwarded_for: Option<String>,
}

impl AccessEntry {
    pub(super) fn new(parts: EntryParts) -> AccessEntry {
        AccessEntry { parts: Some(parts) }
    }

    /// Wraps the response's body so that the line is written (and the span ended) when the body
    /// ends or is dropped, with the bytes sent.
    pub fn finish(mut self, response: http::Response<ProxyBody>) -> http::Response<ProxyBody> {
        let Some(entry) = self.parts.take() else {
            return response;
        };
        let status = Some(response.status().as_u16());
        response.map(|body| {
            AccessBody {
                inner: body,
                line: Some(Line { entry, status }),
                bytes: 0,
            }
            .boxed()
        })
    }
}

impl Drop for AccessEntry {
    fn drop(&mut self) {
        if let Some(entry) = self.parts.take() {
            Line {
                entry,
                status: None,
            }
            .write(0, false);
        }
    }
}

struct Line {
    entry: EntryParts,
    /// None: the request ended before a response head.
    status: Option<u16>,
}

impl Line {
    fn write(self, bytes: u64, complete: bool) {
        let Line { mut entry, status } = self;
        let noted = match entry.note.0.noted.lock() {
            Ok(mut noted) => std::mem::take(&mut *noted),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        let received = entry.note.0.received.load(Ordering::Relaxed);
        let verdict = noted.verdict.unwrap_or(if noted.key.is_some() {
            Verdict::Admitted
        } else {
            Verdict::Unfenced
        });
        let always = verdict == Verdict::Refused || status.is_none_or(|s| s >= 500);
        if let Some(span) = entry.span.take() {
            span.end(
                &entry.method,
                SpanFields {
                    path: &entry.path,
                    route: noted.route.as_deref(),
                    key: noted.key.as_deref(),
                    token: noted.token,
                    verdict: verdict.as_str(),
                    reason: noted.reason,
                    status,
                    bytes,
                },
            );
        }
        let Some(log) = entry.log.take() else {
            return;
        };
        if !always && !log.keeps() {
            return;
        }
        let upstream_ms = noted.upstream.map(|d| d.as_secs_f64() * 1000.0);
        let duration_ms = entry.started.elapsed().as_secs_f64() * 1000.0;
        let client = &entry.client;
        let forwarded_for = client
            .forwarded_for
            .as_deref()
            .filter(|_| noted.trusts_forwarded);
        if log.format == AccessLogFormat::Combined {
            let line = Combined {
                entry: &entry,
                noted: &noted,
                verdict,
                status,
                bytes,
                received,
                complete,
                duration_ms,
                forwarded_for,
            }
            .render();
            tracing::info!(target: "fencegate::access", "{line}");
            return;
        }
        tracing::info!(
            target: "fencegate::access",
            client = client.addr.map(tracing::field::display),
            forwarded_for,
            host = client.host.as_deref(),
            method = %entry.method,
            path = %entry.path,
            protocol = ?client.version,
            user_agent = client.user_agent.as_deref(),
            route = noted.route.as_deref().unwrap_or("-"),
            key = noted.key.as_deref(),
            token = noted.token,
            verdict = verdict.as_str(),
            reason = noted.reason,
            status,
            upstream = noted.upstream_addr.as_deref(),
            upstream_ms,
            duration_ms,
            bytes_received = received,
            bytes,
            complete,
            request_id = %entry.request_id,
            trace_id = entry.trace_id.as_deref(),
            "request"
        );
    }
}

/// One request as nginx's `combined` line — `client - - [time] "request line" status bytes
/// "referer" "user agent"` — followed by the gateway's fields as `name=value` (`-` for none).
struct Combined<'l> {
    entry: &'l EntryParts,
    noted: &'l Noted,
    verdict: Verdict,
    status: Option<u16>,
    bytes: u64,
    received: u64,
    complete: bool,
    duration_ms: f64,
    forwarded_for: Option<&'l str>,
}

impl Combined<'_> {
    fn render(&self) -> String {
        let entry = self.entry;
        let client = &entry.client;
        let noted = self.noted;
        let mut line = String::with_capacity(256);
        // Writing to a String cannot fail.
        let _ = write!(
            line,
            "{} - - [{}] \"{} {} {:?}\" {} {} \"{}\" \"{}\"",
            client
                .addr
                .map_or_else(|| "-".to_owned(), |addr| addr.to_string()),
            combined_time(std::time::SystemTime::now()),
            entry.method,
            quoted(&entry.path),
            client.version,
            self.status.unwrap_or(0),
            self.bytes,
            quoted(client.referer.as_deref().unwrap_or("-")),
            quoted(client.user_agent.as_deref().unwrap_or("-")),
        );
        let dash = |value: Option<&str>| value.map_or_else(|| "-".to_owned(), quoted);
        let _ = write!(
            line,
            " host={} forwarded_for=\"{}\" route={} key={} token={} verdict={} reason={} upstream={} upstream_ms={} duration_ms={:.3} bytes_received={} complete={} request_id={} trace_id={}",
            dash(client.host.as_deref()),
            dash(self.forwarded_for),
            dash(noted.route.as_deref()),
            dash(noted.key.as_deref()),
            noted.token.map_or_else(|| "-".to_owned(), |t| t.to_string()),
            self.verdict.as_str(),
            noted.reason.unwrap_or("-"),
            dash(noted.upstream_addr.as_deref()),
            noted
                .upstream
                .map_or_else(|| "-".to_owned(), |d| format!("{:.3}", d.as_secs_f64() * 1000.0)),
            self.duration_ms,
            self.received,
            self.complete,
            quoted(&entry.request_id),
            dash(entry.trace_id.as_deref()),
        );
        line
    }
}

/// `text` with its double quotes written `\x22`, as nginx writes them, so a quoted field
/// cannot end early; the log writer escapes control characters and backslashes.
fn quoted(text: &str) -> String {
    text.replace('"', "\\x22")
}

/// `now` as nginx's `$time_local` in UTC: `07/Dec/2026:16:00:00 +0000`, from the HTTP date
/// (`Mon, 07 Dec 2026 16:00:00 GMT`).
fn combined_time(now: std::time::SystemTime) -> String {
    let date = httpdate::fmt_http_date(now);
    let mut parts = date.split(' ').skip(1);
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(day), Some(month), Some(year), Some(time)) => {
            format!("{day}/{month}/{year}:{time} +0000")
        }
        _ => date,
    }
}

/// A response body that counts what it yields and writes the access line at its end.
struct AccessBody {
    inner: ProxyBody,
    line: Option<Line>,
    bytes: u64,
}

impl Body for AccessBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) => {
                if let Some(line) = self.line.take() {
                    line.write(self.bytes, true);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(line) = self.line.take() {
                    line.write(self.bytes, false);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for AccessBody {
    fn drop(&mut self) {
        // Never polled to its end: an empty body hyper did not poll, or a client that left.
        if let Some(line) = self.line.take() {
            let complete = self.inner.is_end_stream();
            line.write(self.bytes, complete);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_keeps_the_configured_share() {
        for (sample, expected) in [(1.0, 1000), (0.0, 0), (0.25, 250), (0.1, 100)] {
            let log = AccessLog::new(sample, AccessLogFormat::Fields);
            let kept = (0..1000).filter(|_| log.keeps()).count();
            assert_eq!(kept, expected, "sample {sample}");
        }
    }
}
