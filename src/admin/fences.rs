//! `/admin/fences/{key}`: read a key's mark, and raise it (never lower it, I3).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::{json_body, store_call, AdminError, AdminState, Key, MAX_FENCE_KEY};
use crate::config::Compare;
use crate::store::Advance;

pub(super) async fn read(
    State(state): State<AdminState>,
    Key(key): Key<MAX_FENCE_KEY>,
) -> Result<Response, AdminError> {
    match store_call(state.store.current(&key)).await? {
        Some(fence) => Ok(Json(json!({"key": key, "fence": fence})).into_response()),
        None => Err(AdminError::NoMark { key }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RaiseFence {
    #[serde(deserialize_with = "super::whole_number::u64_field")]
    fence: u64,
}

/// Raises a key's mark; 409 when the requested fence is below it (marks never go down, I3).
pub(super) async fn raise(
    State(state): State<AdminState>,
    Key(key): Key<MAX_FENCE_KEY>,
    body: Bytes,
) -> Result<Response, AdminError> {
    let RaiseFence { fence } = json_body(&body)?;
    match store_call(state.store.advance(&key, fence, Compare::Monotonic)).await? {
        Advance::Accepted { previous } => {
            tracing::info!(%key, fence, ?previous, "mark raised through the admin API");
            Ok(Json(json!({"key": key, "fence": fence, "previous": previous})).into_response())
        }
        Advance::Stale { current } => Err(AdminError::MarkNotLowered { key, current }),
    }
}
