//! Span export in a build without the `otel` feature: the same names as `otlp.rs`, so the access
//! log and the app are written once, but no exporter can be made (the configuration check
//! refuses `[telemetry]` first), so no span ever exists.

use http::HeaderValue;

use super::{ExportError, SpanFields, TraceParent};
use crate::config::TelemetryConfig;

/// No value of this type exists in this build.
pub enum SpanExport {}

impl SpanExport {
    /// Always refuses: this build cannot export spans.
    pub fn start(
        config: &TelemetryConfig,
        _runtime: tokio::runtime::Handle,
    ) -> Result<SpanExport, ExportError> {
        Err(ExportError {
            endpoint: config.otlp_endpoint.clone(),
            reason: crate::config::not_built_message("OTLP span export", "otel"),
        })
    }

    pub fn begin(&self, _parent: Option<TraceParent>, _name: String) -> RequestSpan {
        match *self {}
    }

    pub fn shutdown(&self) {
        match *self {}
    }
}

/// No value of this type exists in this build.
pub enum RequestSpan {}

impl RequestSpan {
    pub fn traceparent(&self) -> Option<HeaderValue> {
        match *self {}
    }

    pub fn trace_id(&self) -> String {
        match *self {}
    }

    pub(super) fn end(self, _method: &http::Method, _fields: SpanFields<'_>) {
        match self {}
    }
}
