//! What reconciliation shares between the command line (`fencegate intents`) and the admin API
//! (`/admin/intents`): how an intent record is shown, and the outcome an operator records.

use serde_json::{json, Value};

use crate::store::{IntentRecord, StoredOutcome};

/// An intent as listed: where it stands, whether an attempt holds it now, its recorded outcome.
pub fn describe(record: &IntentRecord, now_ms: u64) -> Value {
    let outcome = record.outcome.as_ref().map(|o| {
        json!({
            "status": o.status,
            "headers": o.headers.iter().map(|(n, v)| (n.clone(), Value::from(v.clone())))
                .collect::<serde_json::Map<_, _>>(),
            "body": String::from_utf8_lossy(&o.body),
            "body_complete": o.body_complete,
        })
    });
    json!({
        "key": record.key,
        "route": record.route,
        "state": record.state.as_str(),
        "fence": record.fence,
        "in_flight": record.attempt.is_some() && record.attempt_expires_ms > now_ms,
        "created_ms": record.created_ms,
        "updated_ms": record.updated_ms,
        "expires_ms": record.expires_ms,
        "outcome": outcome,
    })
}

/// The provider's answer as an operator reports it: a final status (200 to 599), headers with
/// valid names and values (names lowercased), and the body.
pub fn outcome(
    status: u16,
    headers: impl IntoIterator<Item = (String, String)>,
    body: Vec<u8>,
) -> Result<StoredOutcome, String> {
    // A 1xx is never a final answer: replaying one would break every repeat of the call.
    if !(200..=599).contains(&status) {
        return Err(format!(
            "status {status}: give the provider's final status, from 200 to 599"
        ));
    }
    let headers = headers
        .into_iter()
        .map(|(name, value)| {
            let name = name.trim().to_ascii_lowercase();
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header {name:?}: not a valid header name"))?;
            if !crate::route::is_replayable_header(&name) {
                return Err(format!(
                    "header {name}: it framed the provider's message, not its answer; the replay sets its own"
                ));
            }
            let value = value.trim().to_owned();
            http::HeaderValue::from_str(&value)
                .map_err(|_| format!("header {name}: {value:?} is not a valid value"))?;
            Ok((name, value))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(StoredOutcome {
        status,
        headers,
        body: body.into(),
        body_complete: true,
    })
}
