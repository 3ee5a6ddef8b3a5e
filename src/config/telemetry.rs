//! `[telemetry]`: where request spans are exported (OTLP over HTTP) and what they are named.

use std::time::Duration;

use serde::Deserialize;

use super::duration;

/// The `service.name` of the exported spans unless the file names another.
pub const DEFAULT_SERVICE_NAME: &str = "fencegate";
/// How long one export to the collector may take.
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// `[telemetry]`: absent, the gateway forwards trace context untouched and exports nothing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); spans go to
    /// `<otlp_endpoint>/v1/traces` as protobuf.
    pub otlp_endpoint: String,
    #[serde(default = "default_service_name")]
    pub service_name: String,
    #[serde(default = "default_export_timeout", with = "duration")]
    pub export_timeout: Duration,
}

fn default_service_name() -> String {
    DEFAULT_SERVICE_NAME.to_owned()
}

fn default_export_timeout() -> Duration {
    DEFAULT_EXPORT_TIMEOUT
}
