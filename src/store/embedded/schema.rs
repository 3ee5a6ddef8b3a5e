//! How the embedded store lays out its SQLite file: the marks, identity and intents tables, and
//! how marks and fences are stored (bit for bit as SQLite's signed 64-bit integer).

/// The marks and the store's identity record, created at open.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fence_marks (
    key  TEXT    PRIMARY KEY NOT NULL,
    mark INTEGER NOT NULL  -- the u64 mark, stored bit for bit as SQLite's signed 64-bit integer
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencegate_meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) WITHOUT ROWID;
";

/// The intents table, created at open next to the marks. `fence` holds the u64 bit for bit like
/// `fence_marks.mark`; times are milliseconds since the epoch; `outcome` is
/// `StoredOutcome::to_json()`. A plain rowid table, since a row may carry a replayable body.
pub(super) const INTENTS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS intents (
    key                TEXT    PRIMARY KEY NOT NULL,
    route              TEXT    NOT NULL,
    fence              INTEGER NOT NULL,
    fingerprint        TEXT    NOT NULL,
    state              TEXT    NOT NULL,
    attempt            TEXT,
    attempt_expires_ms INTEGER NOT NULL,
    created_ms         INTEGER NOT NULL,
    updated_ms         INTEGER NOT NULL,
    expires_ms         INTEGER NOT NULL,
    outcome            TEXT
);
CREATE INDEX IF NOT EXISTS intents_submitting_by_updated
    ON intents (updated_ms) WHERE state = 'SUBMITTING';
CREATE INDEX IF NOT EXISTS intents_by_expiry ON intents (expires_ms);
";

/// SQLite integers are signed 64-bit: marks are stored bit for bit (`u64::MAX` reads back as -1).
pub(super) fn encode_mark(mark: u64) -> i64 {
    i64::from_ne_bytes(mark.to_ne_bytes())
}

pub(super) fn decode_mark(stored: i64) -> u64 {
    u64::from_ne_bytes(stored.to_ne_bytes())
}

/// Fences are stored bit for bit as SQLite's signed integer, like marks.
pub(super) fn encode_fence(fence: u64) -> i64 {
    i64::from_ne_bytes(fence.to_ne_bytes())
}

pub(super) fn decode_fence(stored: i64) -> u64 {
    u64::from_ne_bytes(stored.to_ne_bytes())
}
