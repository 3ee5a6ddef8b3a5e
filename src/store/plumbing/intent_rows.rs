//! The SQL backends' shared row of the `intents` table (SQLite and PostgreSQL store the same
//! columns) and its decoding into an [`IntentRecord`], with the errors a hand-edited or newer row
//! can cause.

use crate::store::intents::{IntentCensus, IntentRecord, IntentState, StoredOutcome};

/// The columns of `intents`, in the order of [`IntentRow`] (and of the backends' inserts).
pub(crate) const COLUMNS: &str =
    "key, route, fence, fingerprint, state, attempt, attempt_expires_ms, \
                       created_ms, updated_ms, expires_ms, outcome";

/// One row of `intents` as a SQL backend returns it; `fence` is in the backend's own encoding.
#[derive(sqlx::FromRow)]
pub(crate) struct IntentRow {
    key: String,
    route: String,
    fence: i64,
    fingerprint: String,
    state: String,
    attempt: Option<String>,
    attempt_expires_ms: i64,
    created_ms: i64,
    updated_ms: i64,
    expires_ms: i64,
    outcome: Option<String>,
}

/// A stored record that does not decode (edited by hand, or written by a newer version).
#[derive(Debug, Clone, thiserror::Error)]
#[error("intent {key}: unreadable stored record: {detail}")]
pub(crate) struct CorruptIntent {
    pub key: String,
    pub detail: String,
}

impl IntentRow {
    /// The record, with the fence decoded by the backend's `decode_fence`.
    pub(crate) fn decode(
        self,
        decode_fence: fn(i64) -> u64,
    ) -> Result<IntentRecord, CorruptIntent> {
        let corrupt = |detail: String| CorruptIntent {
            key: self.key.clone(),
            detail,
        };
        let state = IntentState::parse(&self.state)
            .ok_or_else(|| corrupt(format!("unknown state {:?}", self.state)))?;
        let outcome = match &self.outcome {
            None => None,
            Some(json) => Some(
                StoredOutcome::from_json(json)
                    .ok_or_else(|| corrupt("the outcome is not valid JSON".to_owned()))?,
            ),
        };
        let ms = |name: &str, stored: i64| {
            u64::try_from(stored).map_err(|_| corrupt(format!("{name} is negative: {stored}")))
        };
        Ok(IntentRecord {
            attempt_expires_ms: ms("attempt_expires_ms", self.attempt_expires_ms)?,
            created_ms: ms("created_ms", self.created_ms)?,
            updated_ms: ms("updated_ms", self.updated_ms)?,
            expires_ms: ms("expires_ms", self.expires_ms)?,
            fence: decode_fence(self.fence),
            state,
            outcome,
            key: self.key,
            route: self.route,
            fingerprint: self.fingerprint,
            attempt: self.attempt,
        })
    }
}

/// Times beyond `i64::MAX` ms (some 292 million years) are stored as `i64::MAX`, which keeps
/// their order for the `<` and `<=` comparisons of listing and pruning.
/// The census from [`CENSUS_SQL`]'s row.
pub(crate) fn census_of(
    (submitting, oldest_ms, completed): (i64, Option<i64>, i64),
) -> IntentCensus {
    IntentCensus {
        submitting: u64::try_from(submitting).unwrap_or(0),
        oldest_submitting_ms: oldest_ms.map(|ms| u64::try_from(ms).unwrap_or(0)),
        completed: u64::try_from(completed).unwrap_or(0),
    }
}

/// The census in one pass over the intents, the same SQL in SQLite and PostgreSQL: SUBMITTING
/// rows, the oldest one's last update, COMPLETED rows.
pub(crate) const CENSUS_SQL: &str = "SELECT count(CASE WHEN state = 'SUBMITTING' THEN 1 END), \
     min(CASE WHEN state = 'SUBMITTING' THEN updated_ms END), \
     count(CASE WHEN state = 'COMPLETED' THEN 1 END) FROM intents";

pub(crate) fn encode_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}
