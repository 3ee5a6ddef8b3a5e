//! Durable intent records for idempotent calls to providers that cannot be fenced
//! (docs/design.md §6): the record types, the `IntentStore` trait every backend implements, and
//! `decide_begin`, the one rule for what a new attempt finds — shared by the backends so they
//! cannot disagree.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::StoreFuture;

/// Where an intent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum IntentState {
    /// Recorded before the call; the outcome is not known (in flight, or ambiguous after a
    /// timeout, a reset or a 5xx).
    Submitting,
    /// The provider's answer is recorded and is replayed for repeats.
    Completed,
}

impl IntentState {
    pub fn as_str(self) -> &'static str {
        match self {
            IntentState::Submitting => "SUBMITTING",
            IntentState::Completed => "COMPLETED",
        }
    }

    pub fn parse(text: &str) -> Option<IntentState> {
        match text {
            "SUBMITTING" => Some(IntentState::Submitting),
            "COMPLETED" => Some(IntentState::Completed),
            _ => None,
        }
    }
}

/// A provider's answer as stored for replay: status, the configured headers, and the body up to
/// the route's cap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredOutcome {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    #[serde(with = "base64_body")]
    pub body: Bytes,
    /// Whether `body` is the whole body (false: it was longer than the cap and is not replayed).
    pub body_complete: bool,
}

impl StoredOutcome {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    pub fn from_json(text: &str) -> Option<StoredOutcome> {
        serde_json::from_str(text).ok()
    }
}

mod base64_body {
    use base64::Engine as _;
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(body: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(body))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(Bytes::from)
            .map_err(serde::de::Error::custom)
    }
}

/// One intent, as a backend stores it. Times are milliseconds since the Unix epoch, from the
/// gateway's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentRecord {
    /// The idempotency key sent upstream (after HMAC, when configured).
    pub key: String,
    pub route: String,
    /// The newest fence that submitted this intent.
    pub fence: u64,
    /// Digest of method, path and body: a repeat must be the same request.
    pub fingerprint: String,
    pub state: IntentState,
    /// The attempt in flight, if any, and until when it may hold the intent (a lease, so that a
    /// gateway that died mid-call does not block retries forever).
    pub attempt: Option<String>,
    pub attempt_expires_ms: u64,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// End of retention: after it the record is pruned and the key starts afresh.
    pub expires_ms: u64,
    pub outcome: Option<StoredOutcome>,
}

/// A new attempt at a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginRequest {
    pub key: String,
    pub route: String,
    pub fence: u64,
    pub fingerprint: String,
    /// A fresh random id for this attempt.
    pub attempt: String,
    pub attempt_expires_ms: u64,
    pub now_ms: u64,
    pub expires_ms: u64,
}

/// What an attempt found, decided atomically with recording it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begun {
    /// No live record: one was created (SUBMITTING, this attempt in flight). Forward.
    Fresh,
    /// The outcome of an earlier attempt is unknown and nothing is in flight: this attempt now
    /// owns the intent. Forward with the same key.
    Resubmit { previous_fence: u64 },
    /// Another attempt is in flight; retry after its lease.
    InFlight { retry_after_ms: u64 },
    /// The outcome is known: replay it.
    Completed(StoredOutcome),
    /// The key was used for a different request.
    Mismatch,
    /// A newer fence owns the intent.
    Superseded { fence: u64 },
}

/// The one rule for a new attempt. `existing` is the record as stored (if any). Returns the
/// answer and the record to store (`None`: leave the store unchanged).
pub fn decide_begin(
    existing: Option<&IntentRecord>,
    request: &BeginRequest,
) -> (Begun, Option<IntentRecord>) {
    let fresh = || IntentRecord {
        key: request.key.clone(),
        route: request.route.clone(),
        fence: request.fence,
        fingerprint: request.fingerprint.clone(),
        state: IntentState::Submitting,
        attempt: Some(request.attempt.clone()),
        attempt_expires_ms: request.attempt_expires_ms,
        created_ms: request.now_ms,
        updated_ms: request.now_ms,
        expires_ms: request.expires_ms,
        outcome: None,
    };
    let Some(record) = existing.filter(|r| r.expires_ms > request.now_ms) else {
        return (Begun::Fresh, Some(fresh()));
    };
    if record.fingerprint != request.fingerprint {
        return (Begun::Mismatch, None);
    }
    if record.state == IntentState::Completed {
        let outcome = record.outcome.clone().unwrap_or(StoredOutcome {
            status: 500,
            headers: Vec::new(),
            body: Bytes::new(),
            body_complete: false,
        });
        return (Begun::Completed(outcome), None);
    }
    if record.attempt.is_some() && record.attempt_expires_ms > request.now_ms {
        return (
            Begun::InFlight {
                retry_after_ms: record.attempt_expires_ms - request.now_ms,
            },
            None,
        );
    }
    if request.fence < record.fence {
        return (
            Begun::Superseded {
                fence: record.fence,
            },
            None,
        );
    }
    let mut updated = record.clone();
    updated.fence = request.fence;
    updated.attempt = Some(request.attempt.clone());
    updated.attempt_expires_ms = request.attempt_expires_ms;
    updated.updated_ms = request.now_ms;
    (
        Begun::Resubmit {
            previous_fence: record.fence,
        },
        Some(updated),
    )
}

/// What an operator decides for a stuck intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Record what the provider says happened; repeats replay it.
    Outcome(StoredOutcome),
    /// Forget the intent so that the next attempt submits afresh (with the same key).
    Release,
}

/// What `/metrics` shows of the intents: SUBMITTING ones (outcome not known), the oldest's last
/// update (Unix milliseconds), and COMPLETED ones held for replay (until pruned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntentCensus {
    pub submitting: u64,
    pub oldest_submitting_ms: Option<u64>,
    pub completed: u64,
}

/// Intent records, in the same store as the fence marks. Every method is atomic per key.
pub trait IntentStore: Send + Sync + 'static {
    /// Records a new attempt per [`decide_begin`], atomically with reading what is there.
    fn begin(&self, request: BeginRequest) -> StoreFuture<'_, Begun>;
    /// Records the outcome of a call, if the intent is still SUBMITTING. `false`: it was not.
    fn complete(&self, key: &str, outcome: StoredOutcome, now_ms: u64) -> StoreFuture<'_, bool>;
    /// Ends `attempt` without an outcome (timeout, reset, 5xx): the intent stays SUBMITTING and
    /// the next attempt may re-submit.
    fn abandon(&self, key: &str, attempt: &str, now_ms: u64) -> StoreFuture<'_, ()>;
    fn get(&self, key: &str) -> StoreFuture<'_, Option<IntentRecord>>;
    /// SUBMITTING intents last updated before `updated_before_ms`, oldest first, at most `limit`.
    fn list_submitting(
        &self,
        updated_before_ms: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<IntentRecord>>;
    /// How many intents are SUBMITTING (and when the oldest was last updated) and COMPLETED.
    fn census(&self) -> StoreFuture<'_, IntentCensus>;
    /// Applies an operator's decision to a SUBMITTING intent. `false`: no such intent.
    fn resolve(&self, key: &str, resolution: Resolution, now_ms: u64) -> StoreFuture<'_, bool>;
    /// Deletes at most `limit` records whose retention ended; returns how many.
    fn prune(&self, now_ms: u64, limit: usize) -> StoreFuture<'_, usize>;
}

/// Stands in where no intent store was opened (a gateway built on a bare fence store, in tests):
/// every call fails, so idempotent routes fail closed with 503.
pub struct NoIntentStore;

impl NoIntentStore {
    fn unavailable<T: Send + 'static>() -> StoreFuture<'static, T> {
        Box::pin(async {
            Err(super::StoreError::Setup {
                backend: "none",
                detail: "this gateway has no intent store".to_owned(),
            })
        })
    }
}

impl IntentStore for NoIntentStore {
    fn begin(&self, _: BeginRequest) -> StoreFuture<'_, Begun> {
        NoIntentStore::unavailable()
    }
    fn complete(&self, _: &str, _: StoredOutcome, _: u64) -> StoreFuture<'_, bool> {
        NoIntentStore::unavailable()
    }
    fn abandon(&self, _: &str, _: &str, _: u64) -> StoreFuture<'_, ()> {
        NoIntentStore::unavailable()
    }
    fn get(&self, _: &str) -> StoreFuture<'_, Option<IntentRecord>> {
        NoIntentStore::unavailable()
    }
    fn list_submitting(&self, _: u64, _: usize) -> StoreFuture<'_, Vec<IntentRecord>> {
        NoIntentStore::unavailable()
    }
    fn census(&self) -> StoreFuture<'_, IntentCensus> {
        Self::unavailable()
    }
    fn resolve(&self, _: &str, _: Resolution, _: u64) -> StoreFuture<'_, bool> {
        NoIntentStore::unavailable()
    }
    fn prune(&self, _: u64, _: usize) -> StoreFuture<'_, usize> {
        NoIntentStore::unavailable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(fence: u64, fingerprint: &str, now_ms: u64) -> BeginRequest {
        BeginRequest {
            key: "payout:1".to_owned(),
            route: "payouts".to_owned(),
            fence,
            fingerprint: fingerprint.to_owned(),
            attempt: format!("attempt-{now_ms}"),
            attempt_expires_ms: now_ms + 1_000,
            now_ms,
            expires_ms: now_ms + 86_400_000,
        }
    }

    #[test]
    fn the_begin_rule() {
        let (first, record) = decide_begin(None, &request(5, "fp", 0));
        assert_eq!(first, Begun::Fresh);
        let mut record = record.unwrap();
        assert_eq!(
            decide_begin(Some(&record), &request(5, "fp", 10)).0,
            Begun::InFlight {
                retry_after_ms: 990
            }
        );
        assert_eq!(
            decide_begin(Some(&record), &request(5, "other", 10)).0,
            Begun::Mismatch
        );
        // The attempt ended without an outcome: a retry with the same or a newer fence re-submits.
        record.attempt = None;
        assert_eq!(
            decide_begin(Some(&record), &request(4, "fp", 20)).0,
            Begun::Superseded { fence: 5 }
        );
        let (resubmit, updated) = decide_begin(Some(&record), &request(6, "fp", 20));
        assert_eq!(resubmit, Begun::Resubmit { previous_fence: 5 });
        assert_eq!(updated.unwrap().fence, 6);
        // A lease that ran out (the gateway died mid-call) no longer blocks.
        record.attempt = Some("dead".to_owned());
        assert!(matches!(
            decide_begin(Some(&record), &request(5, "fp", 5_000)).0,
            Begun::Resubmit { .. }
        ));
        // A known outcome is replayed; a different request with the key is still refused.
        let outcome = StoredOutcome {
            status: 201,
            headers: vec![],
            body: Bytes::from_static(b"ok"),
            body_complete: true,
        };
        record.state = IntentState::Completed;
        record.outcome = Some(outcome.clone());
        assert_eq!(
            decide_begin(Some(&record), &request(5, "fp", 30)).0,
            Begun::Completed(outcome)
        );
        assert_eq!(
            decide_begin(Some(&record), &request(5, "x", 30)).0,
            Begun::Mismatch
        );
        // After retention the key starts afresh.
        assert_eq!(
            decide_begin(Some(&record), &request(5, "x", 86_400_001)).0,
            Begun::Fresh
        );
    }

    #[test]
    fn outcomes_round_trip_through_json() {
        let outcome = StoredOutcome {
            status: 200,
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: Bytes::from(vec![0, 159, 255, b'{']),
            body_complete: true,
        };
        assert_eq!(StoredOutcome::from_json(&outcome.to_json()), Some(outcome));
    }
}
