//! The batched compare-and-advance on PostgreSQL: one `INSERT … ON CONFLICT DO UPDATE` over
//! arrays for a whole batch, and how its rows answer each request of the batch.

use std::collections::BTreeMap;

use sqlx::postgres::PgConnection;
use tokio::sync::oneshot;

use super::codec::{decode_mark, encode_mark};
use super::BACKEND;
use crate::config::Compare;
use crate::store::guard::expected::mismatch_reason;
use crate::store::{decide, Advance, StoreError};

/// The batched compare-and-advance: one row per key, the previous mark returned by the same
/// atomic update that raises it. With `$3`, the adopted store's id, nothing is advanced unless
/// the store's identity record holds it, and one row with `ok` false says so (a store wiped or
/// replaced since it was adopted).
const ADVANCE_SQL: &str = "
WITH ident AS (
    SELECT $3::text IS NULL OR EXISTS (
        SELECT 1 FROM fencegate_meta WHERE name = 'store_id' AND value = $3::text) AS ok
), advanced AS (
    INSERT INTO fence_marks AS m (key, mark, previous_mark)
    SELECT input.key, input.token, NULL
    FROM unnest($1::text[], $2::bigint[]) AS input(key, token), ident
    WHERE ident.ok
    ON CONFLICT (key) DO UPDATE
        SET previous_mark = m.mark, mark = GREATEST(m.mark, excluded.mark)
    RETURNING m.key, m.previous_mark
)
SELECT advanced.key, advanced.previous_mark, true AS ok FROM advanced
UNION ALL
SELECT NULL, NULL, false FROM ident WHERE NOT ident.ok";

/// One advance asked of the store, answered on `reply`.
pub(super) struct AdvanceRequest {
    pub(super) key: String,
    pub(super) token: u64,
    pub(super) compare: Compare,
    pub(super) reply: oneshot::Sender<Result<Advance, StoreError>>,
}

/// What became of a batch [`execute`] ran.
pub(super) enum Executed {
    /// Every request was answered; the connection is fine.
    Answered,
    /// The statement failed before any answer (nothing was answered): the batch is handed back,
    /// and the connection is in an unknown state.
    Failed {
        batch: Vec<AdvanceRequest>,
        source: sqlx::Error,
    },
}

/// Runs one batch of advances on `connection` and answers each of its requests. `repeated`: the
/// batch already failed once on another connection, whose statement may have run: a key whose
/// mark is now exactly the largest token asked for it may owe that to the lost attempt, so its
/// requests are answered with an error (outcome unknown), never as stale or as a fresh advance —
/// except that largest token under `monotonic`, which passes against its own mark either way.
pub(super) async fn execute(
    connection: &mut PgConnection,
    batch: Vec<AdvanceRequest>,
    expected: Option<&str>,
    repeated: bool,
) -> Executed {
    // One row per key, with the largest token; sorted so concurrent batches lock rows in one order.
    let mut largest: BTreeMap<String, u64> = BTreeMap::new();
    for request in &batch {
        let entry = largest.entry(request.key.clone()).or_insert(request.token);
        *entry = (*entry).max(request.token);
    }
    let keys: Vec<&str> = largest.keys().map(String::as_str).collect();
    let tokens: Vec<i64> = largest.values().map(|t| encode_mark(*t)).collect();
    let rows: Result<Vec<AdvanceRow>, sqlx::Error> = sqlx::query_as(ADVANCE_SQL)
        .bind(&keys)
        .bind(&tokens)
        .bind(expected)
        .fetch_all(connection)
        .await;
    let previous: BTreeMap<String, Option<u64>> = match rows {
        Ok(rows) if rows.iter().any(|(_, _, ok)| !ok) => {
            let reason = mismatch_reason(expected.unwrap_or_default(), None);
            for request in batch {
                let _ = request.reply.send(Err(StoreError::Untrusted {
                    reason: reason.clone(),
                }));
            }
            return Executed::Answered;
        }
        Ok(rows) => rows
            .into_iter()
            .filter_map(|(key, previous, _)| Some((key?, previous.map(decode_mark))))
            .collect(),
        Err(source) => return Executed::Failed { batch, source },
    };
    let batch = if repeated {
        let (unknown, known): (Vec<AdvanceRequest>, Vec<AdvanceRequest>) =
            batch.into_iter().partition(|request| {
                let largest = largest.get(&request.key).copied();
                let at_own_token = previous.get(&request.key).copied().flatten() == largest;
                // The largest monotonic token passes against its own mark either way.
                let passes_anyway =
                    Some(request.token) == largest && request.compare == Compare::Monotonic;
                at_own_token && !passes_anyway
            });
        for request in unknown {
            let _ = request.reply.send(Err(StoreError::Setup {
                backend: BACKEND,
                detail: format!(
                    "the answer to an advance of key {} was lost and its repeat found the key at its own token: whether the token was new is unknown",
                    request.key
                ),
            }));
        }
        known
    } else {
        batch
    };
    answer_in_token_order(batch, &previous);
    Executed::Answered
}

/// One row of [`ADVANCE_SQL`]: the key and the mark it replaced, or (`ok` false, the others
/// NULL) the store's refusal for not holding the adopted identity.
type AdvanceRow = (Option<String>, Option<i64>, bool);

/// Decides every request of a batch: per key, in ascending token order from the mark the
/// statement replaced.
fn answer_in_token_order(mut batch: Vec<AdvanceRequest>, previous: &BTreeMap<String, Option<u64>>) {
    batch.sort_by(|a, b| a.key.cmp(&b.key).then(a.token.cmp(&b.token)));
    let mut running: Option<(String, Option<u64>)> = None;
    for request in batch {
        let mark = match &running {
            Some((key, mark)) if *key == request.key => *mark,
            _ => match previous.get(&request.key) {
                Some(previous) => *previous,
                None => {
                    let _ = request.reply.send(Err(StoreError::Setup {
                        backend: BACKEND,
                        detail: format!(
                            "the advance statement returned no row for key {}",
                            request.key
                        ),
                    }));
                    continue;
                }
            },
        };
        let outcome = decide(mark, request.token, request.compare);
        let after = match outcome {
            Advance::Accepted { .. } => Some(mark.map_or(request.token, |m| m.max(request.token))),
            Advance::Stale { .. } => mark,
        };
        running = Some((request.key, after));
        let _ = request.reply.send(Ok(outcome));
    }
}
