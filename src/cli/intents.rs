//! Reconciliation from the command line (`fencegate intents list|resolve`): list the intents
//! whose outcome is unknown, and record what the provider says happened or release them —
//! on the store itself, or through a running gateway's admin API when that gateway holds the
//! embedded store's file.

use fencegate::idempotency::{now_ms, reconcile};
use fencegate::store::{IntentStore, Resolution};

use super::admin_client::AdminClient;

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
            let before = if age_ms == 0 {
                u64::MAX
            } else {
                now_ms().saturating_sub(age_ms)
            };
            let records = intents
                .list_submitting(before, limit)
                .await
                .map_err(|e| e.to_string())?;
            Ok(json_lines(
                records.iter().map(|r| reconcile::describe(r, now_ms())),
            ))
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
                let headers = parse_headers(&headers)?;
                Resolution::Outcome(reconcile::outcome(status, headers, body.into_bytes())?)
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

/// Runs `request` through a running gateway's admin API (`/admin/intents`); the same text as
/// [`run`] prints, or an error message.
pub async fn run_remote(client: &AdminClient, request: Request) -> Result<String, String> {
    let encode = |text: &str| {
        percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let failed = |answer: &super::admin_client::AdminAnswer| {
        format!(
            "the gateway's admin API at {} answered {}: {}",
            client.addr(),
            answer.status,
            answer.detail()
        )
    };
    match request {
        Request::List { older_than, limit } => {
            let answer = client
                .get(&format!(
                    "/admin/intents?older_than={}&limit={limit}",
                    encode(&older_than)
                ))
                .await
                .map_err(|e| e.to_string())?;
            if !answer.status.is_success() {
                return Err(failed(&answer));
            }
            let listed: serde_json::Value =
                serde_json::from_slice(&answer.body).map_err(|e| format!("admin API: {e}"))?;
            Ok(json_lines(
                listed["intents"].as_array().into_iter().flatten().cloned(),
            ))
        }
        Request::Resolve {
            key,
            release,
            status,
            body,
            headers,
        } => {
            let resolution = if release {
                serde_json::json!({ "release": true })
            } else {
                let status = status.ok_or("give --status or --release")?;
                let headers = parse_headers(&headers)?;
                let mut named = std::collections::HashSet::new();
                if let Some((name, _)) = headers
                    .iter()
                    .find(|(name, _)| !named.insert(name.to_ascii_lowercase()))
                {
                    return Err(format!(
                        "--header {name} is given twice: the admin API of the running gateway takes one value per header (join them with \", \" where the header allows, or resolve while the gateway is stopped)"
                    ));
                }
                let headers: serde_json::Map<String, serde_json::Value> = headers
                    .into_iter()
                    .map(|(name, value)| (name, value.into()))
                    .collect();
                serde_json::json!({ "status": status, "headers": headers, "body": body })
            };
            let answer = client
                .post_json(
                    &format!("/admin/intents/{}/resolve", encode(&key)),
                    &resolution,
                )
                .await
                .map_err(|e| e.to_string())?;
            if answer.status.is_success() {
                Ok(format!("resolved {key}\n"))
            } else {
                Err(failed(&answer))
            }
        }
    }
}

/// `--header "name: value"` options as (name, value) pairs, trimmed.
fn parse_headers(headers: &[String]) -> Result<Vec<(String, String)>, String> {
    headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
                .ok_or(format!("--header {h:?}: write it as `name: value`"))
        })
        .collect()
}

/// One JSON object per line, as `intents list` prints them.
fn json_lines(values: impl Iterator<Item = serde_json::Value>) -> String {
    values.map(|value| format!("{value}\n")).collect()
}
