//! The batched compare-and-advance on PostgreSQL: one `INSERT … ON CONFLICT DO UPDATE` over
//! arrays for a whole batch, and how its rows answer each request of the batch.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::postgres::PgConnection;
use tokio::sync::oneshot;

use super::codec::{decode_mark, encode_mark};
use super::intent_writes::FreshColumns;
use super::BACKEND;
use crate::config::Compare;
use crate::store::expected::mismatch_reason;
use crate::store::intents::IntentRecord;
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
SELECT advanced.key, advanced.previous_mark, true AS ok, false AS began FROM advanced
UNION ALL
SELECT NULL, NULL, false, false FROM ident WHERE NOT ident.ok";

/// [`ADVANCE_SQL`], and in the same statement the fresh intents of advances that carry one
/// (`$4 …`, one row per advance whose key is alone in its batch): each inserted, unless its key
/// has a record, only where its advance passed — the comparison of [`decide`] on the encoded
/// marks, which order as the marks do. `began` rows name the intents inserted.
const ADVANCE_AND_BEGIN_SQL: &str = "
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
), began AS (
    INSERT INTO intents (key, route, fence, fingerprint, state, attempt, attempt_expires_ms,
                         created_ms, updated_ms, expires_ms, outcome)
    SELECT i.key, i.route, i.fence, i.fingerprint, 'SUBMITTING', i.attempt, i.attempt_expires_ms,
           i.now_ms, i.now_ms, i.expires_ms, NULL
    FROM unnest($4::text[], $5::text[], $6::text[], $7::bigint[], $8::text[], $9::text[],
                $10::bigint[], $11::bigint[], $12::bigint[], $13::bool[])
        AS i(mark_key, key, route, fence, fingerprint, attempt, attempt_expires_ms, now_ms,
             expires_ms, strict)
    JOIN advanced AS a ON a.key = i.mark_key
    WHERE a.previous_mark IS NULL OR a.previous_mark < i.fence
       OR (NOT i.strict AND a.previous_mark = i.fence)
    ORDER BY i.key
    ON CONFLICT (key) DO NOTHING
    RETURNING key
)
SELECT advanced.key, advanced.previous_mark, true AS ok, false AS began FROM advanced
UNION ALL
SELECT NULL, NULL, false, false FROM ident WHERE NOT ident.ok
UNION ALL
SELECT began.key, NULL, true, true FROM began";

/// One advance asked of the store, answered on `reply`.
pub(super) struct AdvanceRequest {
    pub(super) key: String,
    pub(super) token: u64,
    pub(super) compare: Compare,
    /// A fresh intent (for the token `token`) to insert in the same statement if the advance
    /// passes; it is tried only when the key is alone in its batch.
    pub(super) then_begin: Option<IntentRecord>,
    pub(super) reply: oneshot::Sender<Result<Advanced, StoreError>>,
}

/// The answer to an [`AdvanceRequest`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Advanced {
    pub(super) advance: Advance,
    /// Whether the request's `then_begin` was inserted (false when it carried none, when its
    /// key was not alone in the batch, or when the intent's key had a record).
    pub(super) began: bool,
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
    let intents = IntentColumns::of(&batch);
    let rows: Result<Vec<AdvanceRow>, sqlx::Error> = if intents.is_empty() {
        sqlx::query_as(ADVANCE_SQL)
            .bind(&keys)
            .bind(&tokens)
            .bind(expected)
            .fetch_all(connection)
            .await
    } else {
        intents
            .bind(
                sqlx::query_as(ADVANCE_AND_BEGIN_SQL)
                    .bind(&keys)
                    .bind(&tokens)
                    .bind(expected),
            )
            .fetch_all(connection)
            .await
    };
    let began: BTreeSet<String> = match &rows {
        Ok(rows) => rows
            .iter()
            .filter(|(_, _, ok, began)| *ok && *began)
            .filter_map(|(key, ..)| key.clone())
            .collect(),
        Err(_) => BTreeSet::new(),
    };
    let rows = rows.map(|rows| {
        rows.into_iter()
            .filter(|(.., began)| !began)
            .collect::<Vec<_>>()
    });
    let previous: BTreeMap<String, Option<u64>> = match rows {
        Ok(rows) if rows.iter().any(|(_, _, ok, _)| !ok) => {
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
            .filter_map(|(key, previous, ..)| Some((key?, previous.map(decode_mark))))
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
    answer_in_token_order(batch, &previous, &began);
    Executed::Answered
}

/// One row of [`ADVANCE_SQL`]: the key and the mark it replaced, or (`ok` false, the others
/// NULL) the store's refusal for not holding the adopted identity; or (`began`) the key of an
/// intent [`ADVANCE_AND_BEGIN_SQL`] inserted.
type AdvanceRow = (Option<String>, Option<i64>, bool, bool);

/// Decides every request of a batch: per key, in ascending token order from the mark the
/// statement replaced.
fn answer_in_token_order(
    mut batch: Vec<AdvanceRequest>,
    previous: &BTreeMap<String, Option<u64>>,
    began: &BTreeSet<String>,
) {
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
        // An intent inserted for a stale advance cannot happen (the statement compares as
        // `decide` does); if it did, the intent would wait, SUBMITTING, for its lease to end.
        let began = matches!(outcome, Advance::Accepted { .. })
            && request
                .then_begin
                .as_ref()
                .is_some_and(|record| began.contains(&record.key));
        let _ = request.reply.send(Ok(Advanced {
            advance: outcome,
            began,
        }));
    }
}

/// The fresh intents of a batch's advances, column by column: only those of keys alone in the
/// batch, whose advance the statement decides exactly as [`decide`] does.
#[derive(Default)]
struct IntentColumns<'a> {
    mark_keys: Vec<&'a str>,
    fresh: FreshColumns<'a>,
    strict: Vec<bool>,
}

type AdvanceQuery<'q> =
    sqlx::query::QueryAs<'q, sqlx::Postgres, AdvanceRow, sqlx::postgres::PgArguments>;

impl<'a> IntentColumns<'a> {
    fn of(batch: &'a [AdvanceRequest]) -> IntentColumns<'a> {
        let mut columns = IntentColumns::default();
        if batch.iter().all(|request| request.then_begin.is_none()) {
            return columns;
        }
        // Marks and intents named once in the batch: a key's advances are decided in token
        // order (`answer_in_token_order`), and an intent's answer must be its request's alone.
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for request in batch {
            *count.entry(request.key.as_str()).or_default() += 1;
            if let Some(record) = &request.then_begin {
                *count.entry(record.key.as_str()).or_default() += 1;
            }
        }
        let alone = |key: &str| count.get(key) == Some(&1);
        for request in batch {
            let Some(record) = &request.then_begin else {
                continue;
            };
            // The intent's fence is the advance's token: the statement compares it with the mark.
            if !alone(&request.key) || !alone(&record.key) || record.fence != request.token {
                continue;
            }
            columns.mark_keys.push(&request.key);
            columns.fresh.push(record);
            columns.strict.push(request.compare == Compare::Strict);
        }
        columns
    }

    fn is_empty(&self) -> bool {
        self.fresh.is_empty()
    }

    /// Binds `$4 …`: the mark keys, the fresh intents' columns, the compare modes.
    fn bind<'q>(&'q self, query: AdvanceQuery<'q>) -> AdvanceQuery<'q> {
        self.fresh
            .bind(query.bind(&self.mark_keys))
            .bind(&self.strict)
    }
}
