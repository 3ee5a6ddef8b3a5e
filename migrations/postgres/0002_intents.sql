-- fencegate's intent records (DESIGN §6): one row per idempotency key, in the same schema as the
-- fence marks.
--
-- fence holds the u64 fence with its top bit flipped, like fence_marks.mark. Times are
-- milliseconds since the Unix epoch from the gateway's clock. outcome is the provider's answer as
-- JSON (StoredOutcome: status, headers, base64 body); cast it with outcome::jsonb to query it.
CREATE TABLE intents (
    key                text   PRIMARY KEY,
    route              text   NOT NULL,
    fence              bigint NOT NULL,
    fingerprint        text   NOT NULL,
    state              text   NOT NULL CHECK (state IN ('SUBMITTING', 'COMPLETED')),
    attempt            text,
    attempt_expires_ms bigint NOT NULL,
    created_ms         bigint NOT NULL,
    updated_ms         bigint NOT NULL,
    expires_ms         bigint NOT NULL,
    outcome            text
);

-- Reconciliation lists stuck SUBMITTING intents, oldest first.
CREATE INDEX intents_submitting_by_updated ON intents (updated_ms) WHERE state = 'SUBMITTING';

-- Retention pruning deletes the records whose retention ended.
CREATE INDEX intents_by_expiry ON intents (expires_ms);
