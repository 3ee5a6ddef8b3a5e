//! The access log: one structured line per request (target `fencegate::access`, level info) —
//! route, key, token, verdict, status, upstream time, bytes, request id — written, and the
//! request's span ended, when the response body has been sent (or abandoned). The layers note
//! what they learn in the request's [`AccessNote`]; refusals and server errors are always
//! written, the rest as sampled.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;

use super::otlp::{RequestSpan, SpanFields};
use crate::body::{BoxError, ProxyBody};

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
pub struct AccessNote(Arc<Mutex<Noted>>);

#[derive(Default)]
struct Noted {
    route: Option<String>,
    key: Option<String>,
    token: Option<u64>,
    verdict: Option<Verdict>,
    reason: Option<&'static str>,
    upstream: Option<Duration>,
}

impl AccessNote {
    fn with(&self, note: impl FnOnce(&mut Noted)) {
        // A poisoned note still holds whatever was written before the panic.
        let mut noted = match self.0.lock() {
            Ok(noted) => noted,
            Err(poisoned) => poisoned.into_inner(),
        };
        note(&mut noted);
    }

    /// The route the request matched.
    pub fn route(&self, name: &str) {
        self.with(|n| n.route = Some(name.to_owned()));
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

    /// How long the upstream took to answer the head.
    pub fn upstream_time(&self, took: Duration) {
        self.with(|n| n.upstream = Some(took));
    }
}

/// The access log's settings: whether it is on, and which fraction of ordinary lines it keeps.
pub struct AccessLog {
    /// Lines kept out of every 2^32 (refusals and 5xx always).
    keep_per_2_32: u64,
    seen: AtomicU64,
}

impl AccessLog {
    /// `sample` from 0.0 (only refusals and errors) to 1.0 (every request).
    pub fn new(sample: f64) -> AccessLog {
        let keep = (sample.clamp(0.0, 1.0) * 4_294_967_296.0).round();
        AccessLog {
            // In range by the clamp: 0 ..= 2^32.
            keep_per_2_32: keep as u64,
            seen: AtomicU64::new(0),
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
        let Line { entry, status } = self;
        let noted = match entry.note.0.lock() {
            Ok(mut noted) => std::mem::take(&mut *noted),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        let verdict = noted.verdict.unwrap_or(if noted.key.is_some() {
            Verdict::Admitted
        } else {
            Verdict::Unfenced
        });
        let always = verdict == Verdict::Refused || status.is_none_or(|s| s >= 500);
        if let Some(span) = entry.span {
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
        let Some(log) = entry.log else {
            return;
        };
        if !always && !log.keeps() {
            return;
        }
        let upstream_ms = noted.upstream.map(|d| d.as_secs_f64() * 1000.0);
        tracing::info!(
            target: "fencegate::access",
            method = %entry.method,
            path = %entry.path,
            route = noted.route.as_deref().unwrap_or("-"),
            key = noted.key.as_deref(),
            token = noted.token,
            verdict = verdict.as_str(),
            reason = noted.reason,
            status,
            upstream_ms,
            duration_ms = entry.started.elapsed().as_secs_f64() * 1000.0,
            bytes,
            complete,
            request_id = %entry.request_id,
            trace_id = entry.trace_id.as_deref(),
            "request"
        );
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
            let log = AccessLog::new(sample);
            let kept = (0..1000).filter(|_| log.keeps()).count();
            assert_eq!(kept, expected, "sample {sample}");
        }
    }
}
