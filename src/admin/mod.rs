//! The admin listener (axum, its own address): Prometheus `/metrics`, `/healthz`, `/readyz`, and
//! behind a bearer token the admin API described by `docs/admin-openapi.json` (served at
//! `/admin/openapi.json`): marks, routes, intents, lock authorities, reload. Its failures are
//! problem details ([`AdminError`]), from the same table of kinds as the data plane's.

mod error;
mod fences;
mod intents;
mod routes;
mod whole_number;

pub use error::AdminError;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::authority::Authorities;
use crate::compiled::ListenerSettings;
use crate::guard::{CheckedStore, StoreTrust};
use crate::metrics::{IntentGauges, Metrics};
use crate::reload::{Reloader, RouteSource};
use crate::route::RouteTable;
use crate::server::Stopping;
use crate::store::{IntentStore, StoreError};
use crate::tls::ListenerTls;

/// How long an admin call waits for the store.
const ADMIN_STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// The admin API's OpenAPI document.
const OPENAPI: &str = include_str!("../../docs/admin-openapi.json");

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub routes: Arc<RouteSource>,
    pub reloader: Arc<Reloader>,
    pub store: Arc<CheckedStore>,
    pub intents: Option<Arc<dyn IntentStore>>,
    pub trust: Arc<StoreTrust>,
    pub metrics: Arc<Metrics>,
    /// The listeners' certificates, for their expiry metric.
    pub listeners: ListenerSettings,
    /// The routes' lock authorities (none before serving starts them).
    pub authorities: Option<Arc<Authorities>>,
    pub token: Arc<str>,
    pub probes_require_token: bool,
    /// Set when the gateway is asked to stop: `/readyz` answers 503 from then on.
    pub stopping: Stopping,
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    let admin = Router::new()
        .route(
            "/admin/fences/{key}",
            only(get(fences::read).put(fences::raise)),
        )
        .route("/admin/routes", only(get(routes::list)))
        .route("/admin/intents", only(get(intents::list)))
        .route("/admin/intents/{key}", only(get(intents::get)))
        .route("/admin/intents/{key}/resolve", only(post(intents::resolve)))
        .route("/admin/authorities", only(get(list_authorities)))
        .route("/admin/reload", only(post(reload)))
        .route("/admin/openapi.json", only(get(openapi)))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let probes = Router::new()
        .route("/metrics", only(get(metrics)))
        .route("/healthz", only(get(|| async { "ok\n" })))
        .route("/readyz", only(get(ready)));
    let probes = if state.probes_require_token {
        probes.route_layer(middleware::from_fn_with_state(state.clone(), require_token))
    } else {
        probes
    };
    admin
        .merge(probes)
        .fallback(|uri: Uri| async move { AdminError::NoSuchEndpoint(uri.path().to_owned()) })
        .with_state(state)
}

/// An endpoint whose other methods are answered 405 as a problem document.
fn only(methods: MethodRouter<AdminState>) -> MethodRouter<AdminState> {
    methods
        .fallback(|method: Method| async move { AdminError::MethodNotAllowed(method.to_string()) })
}

/// The OpenAPI document of this API.
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn require_token(
    State(state): State<AdminState>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), state.token.as_bytes()) => {
            next.run(request).await
        }
        _ => AdminError::Unauthorized.into_response(),
    }
}

/// Compares without an early exit, so response timing does not reveal how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The exposition, after the gauges read at scrape time: intents counted in the store (when an
/// idempotent route needs them) and the certificates' expiry.
async fn metrics(State(state): State<AdminState>) -> Response {
    let routes = state.routes.current();
    let idempotent = routes.routes().any(|route| route.idempotency.is_some());
    let census = match &state.intents {
        Some(intents) if idempotent => Some(intent_gauges(intents.as_ref()).await),
        _ => None,
    };
    if let Some(census) = census {
        state.metrics.set_intents(census);
    }
    state.metrics.set_certificates(
        certificates(&state.listeners, &routes)
            .iter()
            .map(|(name, not_after)| (name.as_str(), *not_after)),
    );
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// SUBMITTING intents and the oldest one's age; `None` when the store did not answer in time.
async fn intent_gauges(intents: &dyn IntentStore) -> Option<IntentGauges> {
    let census = tokio::time::timeout(ADMIN_STORE_TIMEOUT, intents.census()).await;
    let census = match census {
        Ok(Ok(census)) => census,
        Ok(Err(error)) => {
            tracing::warn!(%error, "intents could not be counted for /metrics");
            return None;
        }
        Err(_) => {
            tracing::warn!("intents could not be counted for /metrics: the store timed out");
            return None;
        }
    };
    let now_ms = crate::idempotency::now_ms();
    let age_ms = census
        .oldest_submitting_ms
        .map_or(0, |updated| now_ms.saturating_sub(updated));
    Some(IntentGauges {
        submitting: census.submitting,
        oldest_submitting_age: Duration::from_millis(age_ms),
        completed: census.completed,
    })
}

/// Every certificate the gateway presents, by metric name, with its expiry (Unix seconds).
fn certificates(listeners: &ListenerSettings, routes: &RouteTable) -> Vec<(String, i64)> {
    let listener = |name: &str, tls: &Option<Arc<ListenerTls>>| {
        tls.as_ref()
            .and_then(|tls| tls.not_after())
            .map(|not_after| (name.to_owned(), not_after))
    };
    let upstream = routes.routes().filter_map(|route| {
        let not_after = route.upstream_tls.as_ref()?.client_not_after?;
        Some((format!("upstream:{}", route.name), not_after))
    });
    listener("server", &listeners.data)
        .into_iter()
        .chain(listener("admin", &listeners.admin))
        .chain(upstream)
        .collect()
}

/// Ready: the configuration is loaded (we are running), the gateway has not been asked to stop,
/// the store answers and is trusted, and every lock authority of a route that fails closed
/// without it is in sync.
async fn ready(State(state): State<AdminState>) -> Response {
    if state.stopping.is_stopping() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "stopping: still serving until the drain begins, take no new clients here\n",
        )
            .into_response();
    }
    let lost: Vec<String> = state
        .authorities
        .iter()
        .flat_map(|a| a.statuses())
        .filter(|s| s.fails_closed && !s.in_sync)
        .map(|s| s.route)
        .collect();
    if !lost.is_empty() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "lock authority not followed for route(s) {}: their fenced writes are refused\n",
                lost.join(", ")
            ),
        )
            .into_response();
    }
    if !state.trust.is_trusted() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "store not trusted: run `fencegate store adopt`\n",
        )
            .into_response();
    }
    match tokio::time::timeout(ADMIN_STORE_TIMEOUT, state.store.identity()).await {
        Ok(Ok(_)) => "ready\n".into_response(),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the store does not answer\n",
        )
            .into_response(),
    }
}

/// Every route's lock authority: whether it is in sync, the revision it reached, its holders.
async fn list_authorities(State(state): State<AdminState>) -> Response {
    let statuses = state
        .authorities
        .as_ref()
        .map(|a| a.statuses())
        .unwrap_or_default();
    Json(json!({ "authorities": statuses })).into_response()
}

/// Reloads the routes from the configuration file; 400 with the reason when the file is invalid
/// (the previous routes stay in force).
async fn reload(State(state): State<AdminState>) -> Result<Response, AdminError> {
    let report = state.reloader.reload().map_err(AdminError::InvalidConfig)?;
    Ok(Json(json!({
        "reloaded": true,
        "routes": report.routes,
        "certificates": report.certificates,
        "restart_required": report.restart_required,
    }))
    .into_response())
}

/// A `{key}` path segment, percent-decoded: one that does not decode to UTF-8, or is longer than
/// `MAX` characters (as the OpenAPI document's `maxLength` counts), is answered with a problem document (`invalid-key`), not axum's plain text.
pub(crate) struct Key<const MAX: usize>(pub String);

/// Longest fence key: the data plane's own bound on resource keys (in bytes; a longer key never
/// has a mark).
pub(crate) const MAX_FENCE_KEY: usize = crate::route::MAX_RESOURCE_KEY_LEN;
/// Longest intent key: the route's name, `/`, and the key sent to the provider.
pub(crate) const MAX_INTENT_KEY: usize = 1024;

impl<S: Send + Sync, const MAX: usize> axum::extract::FromRequestParts<S> for Key<MAX> {
    type Rejection = AdminError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(key) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| AdminError::InvalidKey(e.body_text()))?;
        let length = key.chars().count();
        if length > MAX {
            return Err(AdminError::InvalidKey(format!(
                "the key is {length} characters long; at most {MAX} are taken"
            )));
        }
        Ok(Key(key))
    }
}

/// A JSON request body, or a problem document saying what is wrong with it.
fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, AdminError> {
    serde_json::from_slice(body).map_err(|e| AdminError::InvalidBody(format!("JSON body: {e}")))
}

/// A store call of the admin API, bounded by [`ADMIN_STORE_TIMEOUT`].
async fn store_call<T>(
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, AdminError> {
    tokio::time::timeout(ADMIN_STORE_TIMEOUT, call)
        .await
        .map_err(|_| AdminError::StoreTimeout(ADMIN_STORE_TIMEOUT))?
        .map_err(AdminError::Store)
}
