//! What the gateway tells operators about each request beyond metrics: the access log
//! (`access_log.rs`) and W3C trace context (`trace_context.rs`), with a span per request
//! exported over OTLP when `[telemetry]` names a collector (`otlp.rs`; `no_export.rs` in a build
//! without the `otel` feature).

mod access_log;
#[cfg(not(feature = "otel"))]
mod no_export;
#[cfg(feature = "otel")]
mod otlp;
mod trace_context;

pub use access_log::{AccessEntry, AccessLog, AccessNote, ReceivedBody, Verdict};
use access_log::{Client, EntryParts};
#[cfg(not(feature = "otel"))]
use no_export::RequestSpan;
#[cfg(not(feature = "otel"))]
pub use no_export::SpanExport;
#[cfg(feature = "otel")]
use otlp::RequestSpan;
#[cfg(feature = "otel")]
pub use otlp::SpanExport;
pub use trace_context::{TraceParent, TRACEPARENT};

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderName};
use http::Request;

/// The client's forwarding chain, shown in the access line on routes that trust it.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The per-request telemetry every serving thread's gateway shares.
#[derive(Clone, Default)]
pub struct Telemetry {
    /// Absent: no access log.
    pub access_log: Option<Arc<AccessLog>>,
    /// Absent: trace context is forwarded untouched and no span is recorded.
    pub spans: Option<Arc<SpanExport>>,
}

impl Telemetry {
    /// Starts the record of one request, when there is anything to record: puts its
    /// [`AccessNote`] in the request's extensions and, when spans are exported, makes the
    /// request's span the parent named in the `traceparent` the upstream receives.
    /// `client`: the connection's peer address.
    pub fn start<B>(
        &self,
        request: &mut Request<B>,
        request_id: &str,
        client: Option<IpAddr>,
    ) -> Option<AccessEntry> {
        // An access log whose lines the log filter drops (`RUST_LOG=warn`, say) is not kept.
        let log = self
            .access_log
            .as_ref()
            .filter(|_| tracing::enabled!(target: "fencegate::access", tracing::Level::INFO));
        if log.is_none() && self.spans.is_none() {
            return None;
        }
        let parent = TraceParent::from_headers(request.headers());
        let span = self
            .spans
            .as_ref()
            .map(|spans| spans.begin(parent, request.method().to_string()));
        let trace_id = match &span {
            Some(span) => {
                if let Some(value) = span.traceparent() {
                    request.headers_mut().insert(TRACEPARENT, value);
                }
                Some(span.trace_id())
            }
            None => parent.map(|p| p.trace_id_hex()),
        };
        let note = AccessNote::default();
        let text = |name| {
            request
                .headers()
                .get(name)
                .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        };
        let client = Client {
            addr: client,
            host: text(header::HOST).or_else(|| request.uri().authority().map(|a| a.to_string())),
            version: request.version(),
            user_agent: text(header::USER_AGENT),
            referer: text(header::REFERER),
            forwarded_for: text(X_FORWARDED_FOR),
        };
        request.extensions_mut().insert(note.clone());
        Some(AccessEntry::new(EntryParts {
            log: log.cloned(),
            span,
            note,
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            request_id: request_id.to_owned(),
            trace_id,
            started: Instant::now(),
            client,
        }))
    }
}

/// Why span export could not start.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint {endpoint}: {reason}")]
pub struct ExportError {
    endpoint: String,
    reason: String,
}

/// What a request came to, as its span records it.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
struct SpanFields<'a> {
    path: &'a str,
    route: Option<&'a str>,
    key: Option<&'a str>,
    token: Option<u64>,
    verdict: &'static str,
    reason: Option<&'static str>,
    /// None: the request ended before a response head.
    status: Option<u16>,
    bytes: u64,
}
