//! Request spans exported over OTLP/HTTP: one server span per request, child of the client's
//! `traceparent` (or the root of a new trace), whose context is what the upstream receives as
//! its `traceparent`. The OpenTelemetry SDK batches spans on its own thread; its HTTP calls run
//! on the gateway's runtime.

use http::HeaderValue;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use super::{ExportError, SpanFields, TraceParent};
use crate::config::TelemetryConfig;

/// The exporter of this gateway's request spans.
pub struct SpanExport {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl SpanExport {
    /// Starts exporting to `config.otlp_endpoint`; the exporter's calls run on `runtime`.
    pub fn start(
        config: &TelemetryConfig,
        runtime: tokio::runtime::Handle,
    ) -> Result<SpanExport, ExportError> {
        let endpoint = traces_url(&config.otlp_endpoint);
        let client = OnRuntime {
            client: opentelemetry_http::hyper::HyperClient::with_default_connector(
                config.export_timeout,
                None,
            ),
            runtime,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| ExportError {
                endpoint,
                reason: e.to_string(),
            })?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("fencegate");
        Ok(SpanExport { provider, tracer })
    }

    /// Starts the server span of one request under `parent` (the client's trace context).
    pub fn begin(&self, parent: Option<TraceParent>, name: String) -> RequestSpan {
        let context = match parent {
            Some(parent) => Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from_bytes(parent.trace_id),
                opentelemetry::trace::SpanId::from_bytes(parent.parent_id),
                TraceFlags::new(parent.flags),
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        };
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &context);
        RequestSpan { span }
    }

    /// Exports what is buffered and stops (at shutdown).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "span export did not shut down cleanly");
        }
    }
}

/// `<endpoint>/v1/traces`, unless the endpoint already names that path.
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// One request's span, ended with what the request came to.
pub struct RequestSpan {
    span: opentelemetry_sdk::trace::Span,
}

impl RequestSpan {
    /// The `traceparent` the upstream receives: this span as its parent.
    pub fn traceparent(&self) -> Option<HeaderValue> {
        let context = self.span.span_context();
        HeaderValue::from_str(&format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        ))
        .ok()
    }

    /// The trace id, as 32 hex digits.
    pub fn trace_id(&self) -> String {
        self.span.span_context().trace_id().to_string()
    }

    /// Ends the span with what the request came to.
    pub(super) fn end(mut self, method: &http::Method, fields: SpanFields<'_>) {
        let SpanFields {
            path,
            route,
            key,
            token,
            verdict,
            reason,
            status,
            bytes,
        } = fields;
        self.span.update_name(match route {
            Some(route) => format!("{method} {route}"),
            None => method.to_string(),
        });
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.to_string()),
            KeyValue::new("url.path", path.to_owned()),
            KeyValue::new(
                "http.response.body.size",
                i64::try_from(bytes).unwrap_or(i64::MAX),
            ),
            KeyValue::new("fencegate.verdict", verdict),
        ];
        if let Some(route) = route {
            attributes.push(KeyValue::new("fencegate.route", route.to_owned()));
        }
        if let Some(key) = key {
            attributes.push(KeyValue::new("fencegate.key", key.to_owned()));
        }
        if let Some(token) = token {
            attributes.push(KeyValue::new(
                "fencegate.token",
                i64::try_from(token).unwrap_or(i64::MAX),
            ));
        }
        if let Some(reason) = reason {
            attributes.push(KeyValue::new("fencegate.refusal", reason));
        }
        match status {
            Some(status) => attributes.push(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            )),
            None => attributes.push(KeyValue::new("fencegate.abandoned", true)),
        }
        self.span.set_attributes(attributes);
        match status {
            Some(status) if status >= 500 => {
                self.span
                    .set_status(opentelemetry::trace::Status::error(format!(
                        "status {status}"
                    )))
            }
            None => self.span.set_status(opentelemetry::trace::Status::error(
                "the request ended before a response",
            )),
            _ => {}
        }
        self.span.end();
    }
}

/// opentelemetry-http's hyper client, run on the gateway's runtime: the SDK calls the exporter
/// from its own thread, which has no Tokio reactor.
#[derive(Debug)]
struct OnRuntime {
    client: opentelemetry_http::hyper::HyperClient,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| Box::new(e) as HttpError)?
    }
}
