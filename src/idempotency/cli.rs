//! Reconciliation from the command line (`fencegate intents list|resolve`): list the intents
//! whose outcome is unknown, and record what the provider says happened or release them.

use super::now_ms;
use crate::store::{IntentStore, Resolution, StoredOutcome};

/// A parsed `fencegate intents` command.
pub enum Request {
    List {
        older_than: String,
        limit: usize,
    },
    Resolve {
        key: String,
        release: bool,
        status: Option<u16>,
        body: String,
        headers: Vec<String>,
    },
}

/// Runs `request`; the text to print, or an error message.
pub async fn run(intents: &dyn IntentStore, request: Request) -> Result<String, String> {
    match request {
        Request::List { older_than, limit } => {
            let age = humantime::parse_duration(&older_than)
                .map_err(|e| format!("--older-than {older_than:?}: {e}"))?;
            let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
            let records = intents
                .list_submitting(now_ms().saturating_sub(age_ms), limit)
                .await
                .map_err(|e| e.to_string())?;
            let mut text = String::new();
            for record in &records {
                let line = serde_json::json!({
                    "key": record.key,
                    "route": record.route,
                    "state": record.state.as_str(),
                    "fence": record.fence,
                    "in_flight": record.attempt.is_some() && record.attempt_expires_ms > now_ms(),
                    "created_ms": record.created_ms,
                    "updated_ms": record.updated_ms,
                });
                text.push_str(&line.to_string());
                text.push('\n');
            }
            Ok(text)
        }
        Request::Resolve {
            key,
            release,
            status,
            body,
            headers,
        } => {
            let resolution = if release {
                Resolution::Release
            } else {
                let status = status.ok_or("give --status or --release")?;
                let headers = headers
                    .iter()
                    .map(|h| {
                        h.split_once(':')
                            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
                            .ok_or(format!("--header {h:?}: write it as `name: value`"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Resolution::Outcome(StoredOutcome {
                    status,
                    headers,
                    body: body.into_bytes(),
                    body_complete: true,
                })
            };
            let done = intents
                .resolve(&key, resolution, now_ms())
                .await
                .map_err(|e| e.to_string())?;
            if done {
                Ok(format!("resolved {key}\n"))
            } else {
                Err(format!("no SUBMITTING intent {key}"))
            }
        }
    }
}
