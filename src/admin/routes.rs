//! `/admin/routes`: every route as it is in force — its path, the methods it fences, its
//! upstream, and the effective fence and idempotency settings (defaults filled in, no secrets).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::AdminState;
use crate::route::CompiledRoute;

pub(super) async fn list(State(state): State<AdminState>) -> Response {
    let table = state.routes.current();
    let routes: Vec<_> = table.routes().map(|route| describe(route)).collect();
    Json(json!({ "routes": routes })).into_response()
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn describe(route: &CompiledRoute) -> Value {
    let fence = &route.fence;
    let authority = fence.authority.as_ref().map(|a| {
        json!({
            "service": a.kind(),
            "require_live_lease": a.require_live_lease,
            "strict": a.strict,
            "on_unavailable": a.on_unavailable,
        })
    });
    let idempotency = route.idempotency.as_ref().map(|i| {
        json!({
            "header": i.header.as_str(),
            "key": i.key.to_string(),
            "key_format": i.key_format,
            "max_key_length": i.max_key_length,
            "client_key": i.client_key,
            "on_unknown_outcome": i.on_unknown_outcome,
            "retention_ms": millis(i.retention),
            "max_stored_body": i.max_stored_body,
            "max_request_body": i.max_request_body,
            "hmac": i.hmac_secret.is_some(),
        })
    });
    json!({
        "name": route.name,
        "path": route.pattern.to_string(),
        "fenced_methods": route.fenced_methods.describe(),
        "upstream": route.upstream.to_string(),
        "resource_key": route.resource_key.as_ref().map(ToString::to_string),
        "timeout_ms": millis(route.timeout),
        "max_body": route.max_body,
        "fence": {
            "header": fence.header.as_str(),
            "mode": fence.mode,
            "compare": fence.compare,
            "ordering": fence.ordering,
            "on_store_error": fence.on_store_error,
            "store_timeout_ms": millis(fence.store_timeout),
            "gate_timeout_ms": millis(fence.gate_timeout),
            "max_advance": fence.max_advance,
            "signed": fence.signature.is_some(),
            "authority": authority,
        },
        "idempotency": idempotency,
    })
}
