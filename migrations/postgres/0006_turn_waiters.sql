-- Replicas waiting for a key's turn, served in the order they first asked (issue 37). Before this
-- migration a holder took its own key back at once after each turn, so a replica whose requests
-- kept the key busy could keep the others out until their gate timeouts.
--
-- A replica whose take finds the key held (or another replica ahead of it) has a row here: when
-- it first asked (enqueued) and when it last asked (seen). A waiter asks again at least every few
-- hundred milliseconds while it waits; one not seen for the caller's staleness bound (a replica
-- that went away, or whose requests gave up without saying so) no longer counts. A take succeeds
-- only if no other fresh waiter is ahead of the taker; a holder whose turn is over and finds one
-- ahead releases its row instead of taking it back (it yields). A release of a key someone waits
-- for notifies channel fencegate_turn_free (payload: the key), so waiters retry at once instead
-- of polling. Contention only: an uncontended take finds no row here and writes none.
CREATE TABLE fence_turn_waiters (
    key text NOT NULL,
    holder text NOT NULL,
    enqueued timestamptz NOT NULL,
    seen timestamptz NOT NULL,
    PRIMARY KEY (key, holder)
);

-- Whether a replica other than holder_id waits for the key ahead of it: seen since fresh_since,
-- and enqueued before holder_id (or holder_id is not a fresh waiter of the key at all). The one
-- rule of who goes next, used by fencegate_turn_batch and by the gateway's plain take statement.
CREATE FUNCTION fencegate_turn_ahead(turn_key text, holder_id text, fresh_since timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1
        FROM fence_turn_waiters AS w
        LEFT JOIN fence_turn_waiters AS mine
            ON mine.key = w.key AND mine.holder = holder_id AND mine.seen > fresh_since
        WHERE w.key = turn_key AND w.holder <> holder_id AND w.seen > fresh_since
            AND (mine.holder IS NULL OR (w.enqueued, w.holder) < (mine.enqueued, mine.holder)));
$$;

-- Whether a replica other than holder_id waits for the key at all (seen since fresh_since).
CREATE FUNCTION fencegate_turn_waited_for(turn_key text, holder_id text, fresh_since timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM fence_turn_waiters AS w
        WHERE w.key = turn_key AND w.holder <> holder_id AND w.seen > fresh_since);
$$;

-- The batch of migration 0005, with the waiters: a take is made only when no other replica waits
-- ahead (fencegate_turn_ahead); an own turn that is over, of a key another replica waits ahead
-- for, is released instead; a take not made enqueues (or refreshes) this holder as a waiter, and a
-- take made removes it. Answers, besides whether each turn was taken and the mark found, whether
-- another replica waits for a key taken (its holder then writes the release as soon as the turn
-- is over, instead of waiting to be asked). stale_ms: how long a waiter not seen still counts.
--
-- The rows of every key the batch names are locked first, in one order (bytewise, COLLATE "C",
-- as the gateway sorts the keys of its batched advances): the statements below lock them again
-- in other orders, and two batches locking two hot keys in opposite orders would deadlock
-- (PostgreSQL ends one after deadlock_timeout, a second of every key in both batches lost).
DROP FUNCTION fencegate_turn_batch(text, text, text[], bigint[], text[], bigint[], bigint[], bigint[]);

CREATE FUNCTION fencegate_turn_batch(
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
    SELECT coalesce(array_agg(e.k), '{}') INTO ahead
    FROM unnest(take_keys) AS e(k)
    WHERE fencegate_turn_ahead(e.k, holder_id, fresh_since);
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
    PERFORM pg_notify('fencegate_turn_free', r.k)
    FROM unnest(freed) AS r(k)
    WHERE fencegate_turn_waited_for(r.k, holder_id, fresh_since);
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
    )
    SELECT entry.i, entry.held,
        CASE
            WHEN NOT entry.held THEN NULL
            WHEN entry.t IS NULL THEN (SELECT f.mark FROM fence_marks AS f WHERE f.key = entry.k)
            ELSE (SELECT a.previous FROM advanced AS a WHERE a.k = entry.k)
        END,
        entry.held AND fencegate_turn_waited_for(entry.k, holder_id, fresh_since)
    FROM entry
    ORDER BY entry.i;
END
$$;
