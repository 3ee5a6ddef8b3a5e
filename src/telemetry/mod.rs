//! What the gateway tells operators about each request beyond metrics: the access log
//! (`access_log.rs`) and W3C trace context (`trace_context.rs`), with spans exported over OTLP
//! when a collector is configured (`otlp.rs`).

mod access_log;
mod trace_context;

pub use access_log::{AccessEntry, AccessLog, AccessNote, Verdict};
pub use trace_context::TraceParent;

use std::sync::Arc;

/// The per-request telemetry every serving thread's gateway shares.
#[derive(Clone, Default)]
pub struct Telemetry {
    /// Absent: no access log.
    pub access_log: Option<Arc<AccessLog>>,
}
