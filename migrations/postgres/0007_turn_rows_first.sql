-- Turn batches that race to create a key's row no longer deadlock (issue 37), and the rule of who
-- goes next is one function again.
--
-- Every batch locked the rows of its keys in one order first, but a lock sees only the rows its
-- snapshot holds: a row another batch had just created was locked later, out of order, by the
-- take itself, and two or three batches could each hold a row another needed (PostgreSQL broke
-- the cycle after deadlock_timeout, failing a batch). Now a batch first creates the rows it lacks,
-- empty and in the same order, waiting for any other batch creating one of them; its lock, a
-- statement later, then sees every row it names. The gateway's plain take-and-advance statement
-- (one snapshot) creates the rows its snapshot lacks the same way, taken at once, locks the rest,
-- and does nothing more when a row it could not see was created meanwhile; the gateway sends the
-- takes left again. Renewals, the releases of a replica that closes and a waiter leaving a queue
-- lock the rows in the same order as well.
--
-- fencegate_turn_waiting replaces fencegate_turn_ahead and fencegate_turn_waited_for: one read of
-- the fresh waiters of a whole batch's keys (one index scan, instead of two calls for every key).

-- The keys among turn_keys that a replica other than holder_id waits for (seen since
-- fresh_since), and for each whether one of them waits ahead of holder_id: enqueued before it, or
-- holder_id is not a fresh waiter of the key at all. The one rule of who goes next, read by
-- fencegate_turn_batch and by the gateway's plain take-and-advance statement.
CREATE FUNCTION fencegate_turn_waiting(turn_keys text[], holder_id text, fresh_since timestamptz)
RETURNS TABLE (key text, ahead boolean)
LANGUAGE sql STABLE AS $$
    SELECT w.key,
        bool_or(mine.holder IS NULL OR (w.enqueued, w.holder) < (mine.enqueued, mine.holder))
    FROM fence_turn_waiters AS w
    LEFT JOIN fence_turn_waiters AS mine
        ON mine.key = w.key AND mine.holder = holder_id AND mine.seen > fresh_since
    WHERE w.key = ANY(turn_keys) AND w.holder <> holder_id AND w.seen > fresh_since
    GROUP BY w.key;
$$;

-- The batch of migration 0006, creating its missing rows before it locks them, and reading the
-- waiters through fencegate_turn_waiting.
CREATE OR REPLACE FUNCTION fencegate_turn_batch(
    holder_id text, store_id text,
    release_keys text[], release_turns bigint[],
    take_keys text[], take_turns bigint[], lease_ms bigint[], tokens bigint[],
    stale_ms bigint)
RETURNS TABLE (n integer, taken boolean, mark bigint, wanted boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    found_id text;
    taken_keys text[];
    freed text[] := '{}';
    yielded text[];
    ahead text[];
    fresh_since timestamptz := clock_timestamp() - stale_ms * interval '1 millisecond';
BEGIN
    IF store_id IS NOT NULL THEN
        SELECT m.value INTO found_id FROM fencegate_meta AS m WHERE m.name = 'store_id';
        IF found_id IS DISTINCT FROM store_id THEN
            RAISE EXCEPTION 'fencegate: the store identity is %, not %', coalesce(found_id, 'missing'), store_id
                USING ERRCODE = 'FG001';
        END IF;
    END IF;
    -- A key released has a row (its turn was taken). A row another batch is creating is waited
    -- for here, before this batch locks anything.
    INSERT INTO fence_marks AS f (key)
    SELECT e.k FROM unnest(take_keys) AS e(k)
    WHERE NOT EXISTS (SELECT 1 FROM fence_marks AS m WHERE m.key = e.k)
    ORDER BY e.k COLLATE "C"
    ON CONFLICT (key) DO NOTHING;
    PERFORM 1 FROM fence_marks AS f
    WHERE f.key = ANY(release_keys || take_keys)
    ORDER BY f.key COLLATE "C"
    FOR UPDATE;
    IF cardinality(release_keys) > 0 THEN
        IF cardinality(take_keys) = 0 THEN
            -- Only releases: a release lost in a crash of the server lets its lease lapse, so
            -- this transaction need not wait for its commit to reach the disk.
            SET LOCAL synchronous_commit = off;
        END IF;
        WITH released AS (
            UPDATE fence_marks AS f SET turn_expires = '-infinity'
            FROM unnest(release_keys, release_turns) AS r(k, t)
            WHERE f.key = r.k AND f.turn_holder = holder_id AND f.turn = r.t
            RETURNING f.key
        )
        SELECT coalesce(array_agg(released.key), '{}') INTO freed FROM released;
    END IF;
    SELECT coalesce(array_agg(w.key), '{}') INTO ahead
    FROM fencegate_turn_waiting(take_keys, holder_id, fresh_since) AS w
    WHERE w.ahead;
    WITH entry AS (
        SELECT e.k AS k, e.turn AS turn, e.l AS l
        FROM unnest(take_keys, take_turns, lease_ms) AS e(k, turn, l)
        WHERE NOT (e.k = ANY(ahead))
    ), took AS (
        INSERT INTO fence_marks AS f (key, mark, previous_mark, turn_holder, turn, turn_expires)
        SELECT entry.k, NULL, NULL, holder_id, entry.turn,
            clock_timestamp() + entry.l * interval '1 millisecond'
        FROM entry ORDER BY entry.k COLLATE "C"
        ON CONFLICT (key) DO UPDATE
            SET turn_holder = excluded.turn_holder, turn = excluded.turn,
                turn_expires = excluded.turn_expires
            WHERE f.turn_expires IS NULL OR f.turn_expires <= clock_timestamp()
                OR f.turn_holder = excluded.turn_holder
        RETURNING f.key
    )
    SELECT coalesce(array_agg(took.key), '{}') INTO taken_keys FROM took;
    -- This holder's own turns of keys another replica waits ahead for are over (a replica takes
    -- a key only under its in-process turn): released, not taken back.
    WITH gave AS (
        UPDATE fence_marks AS f SET turn_expires = '-infinity'
        WHERE f.key = ANY(ahead) AND f.turn_holder = holder_id
            AND f.turn_expires > clock_timestamp()
        RETURNING f.key
    )
    SELECT coalesce(array_agg(gave.key), '{}') INTO yielded FROM gave;
    freed := freed || yielded;
    DELETE FROM fence_turn_waiters AS w
    WHERE w.holder = holder_id AND w.key = ANY(taken_keys);
    INSERT INTO fence_turn_waiters AS w (key, holder, enqueued, seen)
    SELECT e.k, holder_id, clock_timestamp(), clock_timestamp()
    FROM unnest(take_keys) AS e(k)
    WHERE NOT (e.k = ANY(taken_keys))
    ORDER BY e.k COLLATE "C"
    ON CONFLICT (key, holder) DO UPDATE
        SET seen = excluded.seen,
            enqueued = CASE WHEN w.seen > fresh_since THEN w.enqueued ELSE excluded.enqueued END;
    -- The holder of each key not taken hears that this replica wants it: a holder writes the
    -- release of a turn whose forward has ended only once someone wants the key.
    PERFORM pg_notify('fencegate_turns', f.turn_holder || ' ' || f.key)
    FROM unnest(take_keys) AS e(k) JOIN fence_marks AS f ON f.key = e.k
    WHERE NOT (e.k = ANY(taken_keys)) AND f.turn_holder IS DISTINCT FROM holder_id
        AND f.turn_expires > clock_timestamp();
    -- Replicas waiting for a key released here retry at once.
    PERFORM pg_notify('fencegate_turn_free', w.key)
    FROM fencegate_turn_waiting(freed, holder_id, fresh_since) AS w;
    -- A new statement, so a new snapshot: the marks read and replaced below include every
    -- advance committed before the turns above were taken.
    RETURN QUERY
    WITH entry AS (
        SELECT e.i::integer AS i, e.k AS k, e.t AS t, e.k = ANY(taken_keys) AS held
        FROM unnest(take_keys, tokens) WITH ORDINALITY AS e(k, t, i)
    ), advanced AS (
        UPDATE fence_marks AS f
        SET previous_mark = f.mark, mark = GREATEST(f.mark, entry.t)
        FROM entry
        WHERE entry.held AND entry.t IS NOT NULL AND f.key = entry.k
        RETURNING f.key AS k, f.previous_mark AS previous
    ), waited AS (
        SELECT w.key FROM fencegate_turn_waiting(taken_keys, holder_id, fresh_since) AS w
    )
    SELECT entry.i, entry.held,
        CASE
            WHEN NOT entry.held THEN NULL
            WHEN entry.t IS NULL THEN (SELECT f.mark FROM fence_marks AS f WHERE f.key = entry.k)
            ELSE (SELECT a.previous FROM advanced AS a WHERE a.k = entry.k)
        END,
        entry.held AND EXISTS (SELECT 1 FROM waited WHERE waited.key = entry.k)
    FROM entry
    ORDER BY entry.i;
END
$$;

-- Renewals lock their rows in the batches' order before extending them.
CREATE OR REPLACE FUNCTION fencegate_turn_renew(
    holder_id text, keys text[], turns bigint[], lease_ms bigint[])
RETURNS TABLE (key text)
LANGUAGE sql VOLATILE AS $$
    WITH locked AS (
        SELECT count(*) AS n FROM (
            SELECT 1 FROM fence_marks AS f
            WHERE f.key = ANY(keys)
            ORDER BY f.key COLLATE "C"
            FOR UPDATE) AS rows
    )
    UPDATE fence_marks AS f
    SET turn_expires = clock_timestamp() + r.l * interval '1 millisecond'
    FROM unnest(keys, turns, lease_ms) AS r(k, t, l), locked
    WHERE f.key = r.k AND f.turn_holder = holder_id AND f.turn = r.t
    RETURNING f.key;
$$;

DROP FUNCTION fencegate_turn_ahead(text, text, timestamptz);
DROP FUNCTION fencegate_turn_waited_for(text, text, timestamptz);
