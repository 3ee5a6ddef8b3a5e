//! `/admin/intents`: reconciliation while serving, on every backend: list the intents whose
//! outcome is unknown, look one up, and record the provider's outcome or release it for a retry.

use std::collections::BTreeMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::{json_body, store_call, AdminError, AdminState, Key, MAX_INTENT_KEY};
use crate::idempotency::{now_ms, reconcile};
use crate::store::{IntentState, Resolution};

/// Most intents one listing returns.
const MAX_LISTED_INTENTS: usize = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    older_than: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// SUBMITTING intents not updated for at least `older_than` (default: all of them).
pub(super) async fn list(
    State(state): State<AdminState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, AdminError> {
    let Query(query) = query.map_err(|e| AdminError::InvalidQuery(e.body_text()))?;
    if query.state.as_deref().is_some_and(|s| s != "submitting") {
        return Err(AdminError::InvalidQuery(
            "state: only state=submitting can be listed".to_owned(),
        ));
    }
    let age = query
        .older_than
        .as_deref()
        .map(humantime::parse_duration)
        .transpose()
        .map_err(|e| AdminError::InvalidQuery(format!("older_than: {e}")))?
        .unwrap_or_default();
    let limit = query
        .limit
        .unwrap_or(MAX_LISTED_INTENTS)
        .min(MAX_LISTED_INTENTS);
    let Some(intents) = &state.intents else {
        return Ok(Json(json!({ "intents": [] })).into_response());
    };
    // Listed: updated before `before`. No age lists every one, including one updated this
    // millisecond.
    let before = match u64::try_from(age.as_millis()).unwrap_or(u64::MAX) {
        0 => u64::MAX,
        age_ms => now_ms().saturating_sub(age_ms),
    };
    let records = store_call(intents.list_submitting(before, limit)).await?;
    let now = now_ms();
    let listed: Vec<_> = records
        .iter()
        .map(|r| reconcile::describe(r, now))
        .collect();
    Ok(Json(json!({ "intents": listed })).into_response())
}

/// One intent, in any state.
pub(super) async fn get(
    State(state): State<AdminState>,
    Key(key): Key<MAX_INTENT_KEY>,
) -> Result<Response, AdminError> {
    let Some(intents) = &state.intents else {
        return Err(AdminError::NoIntent { key });
    };
    match store_call(intents.get(&key)).await? {
        Some(record) => Ok(Json(reconcile::describe(&record, now_ms())).into_response()),
        None => Err(AdminError::NoIntent { key }),
    }
}

/// What the operator learned from the provider: an outcome, or `release: true`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(default)]
    release: bool,
    #[serde(default, deserialize_with = "super::whole_number::optional_u16_field")]
    status: Option<u16>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    body: Option<String>,
}

/// Records the provider's outcome of a SUBMITTING intent (replayed to repeats), or releases it
/// so that the next attempt submits again with the same idempotency key.
pub(super) async fn resolve(
    State(state): State<AdminState>,
    Key(key): Key<MAX_INTENT_KEY>,
    body: Bytes,
) -> Result<Response, AdminError> {
    let request: ResolveBody = json_body(&body)?;
    let (resolution, named) = match (request.release, request.status) {
        (true, None) if request.headers.is_some() || request.body.is_some() => {
            return Err(AdminError::InvalidBody(
                "release: true takes no headers or body: it records no outcome".into(),
            ))
        }
        (true, None) => (Resolution::Release, "released"),
        (false, Some(status)) => {
            let outcome = reconcile::outcome(
                status,
                request.headers.unwrap_or_default(),
                request.body.unwrap_or_default().into_bytes(),
            )
            .map_err(AdminError::InvalidBody)?;
            (Resolution::Outcome(outcome), "outcome")
        }
        (true, Some(_)) => {
            return Err(AdminError::InvalidBody(
                "give either status (the provider's outcome) or release: true, not both".into(),
            ))
        }
        (false, None) => {
            return Err(AdminError::InvalidBody(
                "give status (the provider's outcome) or release: true".into(),
            ))
        }
    };
    let Some(intents) = &state.intents else {
        return Err(AdminError::NoIntent { key });
    };
    match store_call(intents.get(&key)).await? {
        None => return Err(AdminError::NoIntent { key }),
        Some(record) if record.state != IntentState::Submitting => {
            return Err(AdminError::IntentNotSubmitting {
                key,
                state: record.state.as_str(),
            })
        }
        Some(_) => {}
    }
    if !store_call(intents.resolve(&key, resolution, now_ms())).await? {
        // Completed or pruned between the look-up and the resolve.
        return Err(AdminError::IntentNotSubmitting {
            key,
            state: IntentState::Completed.as_str(),
        });
    }
    tracing::info!(%key, resolution = named, "intent resolved through the admin API");
    Ok(Json(json!({"key": key, "resolution": named})).into_response())
}
