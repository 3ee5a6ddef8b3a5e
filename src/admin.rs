//! The admin listener (axum, its own address): Prometheus `/metrics`, `/healthz`, `/readyz`, and
//! behind a bearer token the admin API — read and raise a key's mark (never lower it, I3), list
//! routes, list intents whose outcome is unknown, list the lock authorities, reload the routes.
//! Its failures are problem details, from the same table of kinds as the data plane's.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::authority::Authorities;
use crate::config::Compare;
use crate::error::{ErrorKind, Level};
use crate::metrics::Metrics;
use crate::reload::{Reloader, RouteSource};
use crate::store::{Advance, CheckedStore, IntentStore, StoreError, StoreTrust};

/// How long an admin call waits for the store.
const ADMIN_STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most intents one listing returns.
const MAX_LISTED_INTENTS: usize = 1000;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub routes: Arc<RouteSource>,
    pub reloader: Arc<Reloader>,
    pub store: Arc<CheckedStore>,
    pub intents: Option<Arc<dyn IntentStore>>,
    pub trust: Arc<StoreTrust>,
    pub metrics: Arc<Metrics>,
    /// The routes' lock authorities (none before serving starts them).
    pub authorities: Option<Arc<Authorities>>,
    pub token: Arc<str>,
    pub probes_require_token: bool,
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    let admin = Router::new()
        .route("/admin/fences/{key}", get(read_fence).put(raise_fence))
        .route("/admin/routes", get(list_routes))
        .route("/admin/intents", get(list_intents))
        .route("/admin/authorities", get(list_authorities))
        .route("/admin/reload", axum::routing::post(reload))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let probes = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready));
    let probes = if state.probes_require_token {
        probes.route_layer(middleware::from_fn_with_state(state.clone(), require_token))
    } else {
        probes
    };
    admin.merge(probes).with_state(state)
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

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(&state.routes.current()),
    )
        .into_response()
}

/// Ready: the configuration is loaded (we are running), the store answers and is trusted, and
/// every lock authority of a route that fails closed without it is in sync.
async fn ready(State(state): State<AdminState>) -> Response {
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

async fn read_fence(
    State(state): State<AdminState>,
    Path(key): Path<String>,
) -> Result<Response, AdminError> {
    match store_call(state.store.current(&key)).await? {
        Some(fence) => Ok(Json(json!({"key": key, "fence": fence})).into_response()),
        None => Err(AdminError::NoMark { key }),
    }
}

#[derive(Deserialize)]
struct RaiseFence {
    fence: u64,
}

/// Raises a key's mark; 409 when the requested fence is below it (marks never go down, I3).
async fn raise_fence(
    State(state): State<AdminState>,
    Path(key): Path<String>,
    Json(body): Json<RaiseFence>,
) -> Result<Response, AdminError> {
    match store_call(state.store.advance(&key, body.fence, Compare::Monotonic)).await? {
        Advance::Accepted { previous } => {
            tracing::info!(%key, fence = body.fence, ?previous, "mark raised through the admin API");
            Ok(
                Json(json!({"key": key, "fence": body.fence, "previous": previous}))
                    .into_response(),
            )
        }
        Advance::Stale { current } => Err(AdminError::MarkNotLowered { key, current }),
    }
}

async fn list_routes(State(state): State<AdminState>) -> Response {
    let table = state.routes.current();
    let routes: Vec<_> = table
        .routes()
        .map(|route| {
            json!({
                "name": route.name,
                "fenced_methods": route.fenced_methods.describe(),
                "mode": format!("{:?}", route.fence.mode).to_lowercase(),
                "compare": format!("{:?}", route.fence.compare).to_lowercase(),
                "ordering": format!("{:?}", route.fence.ordering).to_lowercase(),
                "idempotency": route.idempotency.is_some(),
            })
        })
        .collect();
    Json(json!({ "routes": routes })).into_response()
}

#[derive(Deserialize)]
struct IntentQuery {
    #[serde(default = "default_state")]
    state: String,
    #[serde(default)]
    older_than: Option<String>,
}

fn default_state() -> String {
    "submitting".to_owned()
}

async fn list_intents(
    State(state): State<AdminState>,
    Query(query): Query<IntentQuery>,
) -> Result<Response, AdminError> {
    if query.state != "submitting" {
        return Err(AdminError::InvalidQuery(
            "only state=submitting can be listed".to_owned(),
        ));
    }
    let age = query
        .older_than
        .as_deref()
        .map(humantime::parse_duration)
        .transpose()
        .map_err(|e| AdminError::InvalidQuery(format!("older_than: {e}")))?
        .unwrap_or_default();
    let Some(intents) = &state.intents else {
        return Ok(Json(json!({ "intents": [] })).into_response());
    };
    let before = crate::idempotency::now_ms()
        .saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX));
    let records = store_call(intents.list_submitting(before, MAX_LISTED_INTENTS)).await?;
    let now = crate::idempotency::now_ms();
    let listed: Vec<_> = records
        .iter()
        .map(|r| {
            json!({
                "key": r.key, "route": r.route, "state": r.state.as_str(), "fence": r.fence,
                "in_flight": r.attempt.is_some() && r.attempt_expires_ms > now,
                "created_ms": r.created_ms, "updated_ms": r.updated_ms,
            })
        })
        .collect();
    Ok(Json(json!({ "intents": listed })).into_response())
}

/// Reloads the routes from the configuration file; 400 with the reason when the file is invalid
/// (the previous routes stay in force).
async fn reload(State(state): State<AdminState>) -> Result<Response, AdminError> {
    let report = state.reloader.reload().map_err(AdminError::InvalidConfig)?;
    Ok(Json(
        json!({"reloaded": true, "routes": report.routes, "certificates": report.certificates}),
    )
    .into_response())
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

/// Every way an admin call fails, answered as problem details through the same table
/// ([`ErrorKind`]) as the data plane's refusals.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("key {key}: no mark for this key")]
    NoMark { key: String },
    #[error("key {key}: the mark is {current}; marks never go down")]
    MarkNotLowered { key: String, current: u64 },
    #[error("{0}")]
    InvalidQuery(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("the store did not answer within {0:?}")]
    StoreTimeout(Duration),
    #[error(transparent)]
    Store(StoreError),
}

impl AdminError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            AdminError::Unauthorized => ErrorKind::Unauthorized,
            AdminError::NoMark { .. } => ErrorKind::NoMark,
            AdminError::MarkNotLowered { .. } => ErrorKind::MarkNotLowered,
            AdminError::InvalidQuery(_) => ErrorKind::InvalidQuery,
            AdminError::InvalidConfig(_) => ErrorKind::InvalidConfig,
            AdminError::StoreTimeout(_) => ErrorKind::StoreTimeout,
            AdminError::Store(StoreError::Untrusted { .. }) => ErrorKind::StoreUntrusted,
            AdminError::Store(_) => ErrorKind::StoreUnavailable,
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let kind = self.kind();
        if matches!(kind.spec().level, Level::Warn | Level::Error) {
            tracing::warn!(error = %self, "admin call failed");
        }
        let mut problem = kind.problem(self.to_string());
        match &self {
            AdminError::NoMark { key } => problem.key = Some(key.clone()),
            AdminError::MarkNotLowered { key, current } => {
                problem.key = Some(key.clone());
                problem.current_fence = Some(*current);
            }
            _ => {}
        }
        let mut response = problem.into_response().map(axum::body::Body::new);
        if let AdminError::Unauthorized = self {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
