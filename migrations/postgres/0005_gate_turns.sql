-- The ordering gate's key turns as leases (issue 17): a key's turn is held in the key's own row of
-- fence_marks, naming the replica that holds it (turn_holder) and which of its turns it is, with
-- an expiry on the server's clock (turn_expires). A lost or reset connection frees nothing:
-- another replica takes the key only after the holder released the turn (turn_expires set to
-- -infinity) or the expiry passed. The holder sets the expiry past the end its forward is certain
-- to have (route timeout, connection teardown, a margin) and renews it while a response streams.
--
-- In the mark's row, a serialized write's take, advance and release are updates of one row (heap
-- only: no indexed column changes, and the fill factor leaves room on new pages). A key whose turn
-- was taken before it had a mark has a row with mark NULL: no mark. A holder writes a release
-- only when another replica wants the key (told by pg_notify on channel fencegate_turns, payload
-- "{holder} {key}", from the take that found the key held); until then the row names a turn that
-- is over, which its holder takes back at once and which lapses by its lease.
ALTER TABLE fence_marks
    ALTER COLUMN mark DROP NOT NULL,
    ADD COLUMN turn_holder text,
    ADD COLUMN turn bigint,
    ADD COLUMN turn_expires timestamptz;
ALTER TABLE fence_marks SET (fillfactor = 70);

CREATE OR REPLACE VIEW fence_marks_readable AS
    SELECT key, (mark::numeric + 9223372036854775808) AS mark
    FROM fence_marks
    WHERE mark IS NOT NULL;

-- The advisory-lock functions of migrations 0003 and 0004 are no longer called.
DROP FUNCTION IF EXISTS fencegate_lock_and_read(bigint[], text[]);
DROP FUNCTION IF EXISTS fencegate_gate_batch(bigint[], bigint[], text[], bigint[]);

-- One holder batch in one transaction: release the turns given back, take the new ones and, for
-- each turn taken, either read the key's mark (token NULL) or compare-and-advance it under the
-- turn just taken (raised to the greater of the two; the caller decides from the mark it
-- replaced). A key is free when it has no row or no turn, when its turn has expired, or when its
-- turn is this holder's own: a replica takes a key only under its in-process turn, so a turn of
-- its own is an earlier one that is over and whose release has not run (or was lost). Taking a
-- turn that is already this holder's same turn succeeds again, so a batch whose answer was lost
-- can be sent again. (The gateway sends a batch whose every take advances as one plain statement
-- instead, with the same effect.)
--
-- With store_id given (not NULL), the store's identity record is compared first and a store that
-- lost it (wiped, replaced) fails the whole batch with SQLSTATE FG001 before anything is taken or
-- advanced. Each query in a VOLATILE plpgsql function takes a new snapshot (the holder sessions
-- use READ COMMITTED), so the reads and advances, one statement after the takes, see every
-- advance committed before a turn was taken (one statement for both could read a snapshot from
-- before a turn it waited for was released). Answers one row per entry, in order: whether the
-- turn was taken and the mark found (before the entry's own advance), stored with its top bit
-- flipped; NULL when not taken or the key had no mark. Keys must be distinct in a call.
CREATE FUNCTION fencegate_turn_batch(
    holder_id text, store_id text,
    release_keys text[], release_turns bigint[],
    take_keys text[], take_turns bigint[], lease_ms bigint[], tokens bigint[])
RETURNS TABLE (n integer, taken boolean, mark bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    found_id text;
    taken_keys text[];
BEGIN
    IF store_id IS NOT NULL THEN
        SELECT m.value INTO found_id FROM fencegate_meta AS m WHERE m.name = 'store_id';
        IF found_id IS DISTINCT FROM store_id THEN
            RAISE EXCEPTION 'fencegate: the store identity is %, not %', coalesce(found_id, 'missing'), store_id
                USING ERRCODE = 'FG001';
        END IF;
    END IF;
    IF cardinality(release_keys) > 0 THEN
        IF cardinality(take_keys) = 0 THEN
            -- Only releases: a release lost in a crash of the server lets its lease lapse, so
            -- this transaction need not wait for its commit to reach the disk.
            SET LOCAL synchronous_commit = off;
        END IF;
        UPDATE fence_marks AS f SET turn_expires = '-infinity'
        FROM unnest(release_keys, release_turns) AS r(k, t)
        WHERE f.key = r.k AND f.turn_holder = holder_id AND f.turn = r.t;
    END IF;
    WITH entry AS (
        SELECT e.k AS k, e.turn AS turn, e.l AS l
        FROM unnest(take_keys, take_turns, lease_ms) AS e(k, turn, l)
    ), took AS (
        INSERT INTO fence_marks AS f (key, mark, previous_mark, turn_holder, turn, turn_expires)
        SELECT entry.k, NULL, NULL, holder_id, entry.turn,
            clock_timestamp() + entry.l * interval '1 millisecond'
        FROM entry ORDER BY entry.k
        ON CONFLICT (key) DO UPDATE
            SET turn_holder = excluded.turn_holder, turn = excluded.turn,
                turn_expires = excluded.turn_expires
            WHERE f.turn_expires IS NULL OR f.turn_expires <= clock_timestamp()
                OR f.turn_holder = excluded.turn_holder
        RETURNING f.key
    )
    SELECT coalesce(array_agg(took.key), '{}') INTO taken_keys FROM took;
    -- The holder of each key not taken hears that this replica wants it: a holder writes the
    -- release of a turn whose forward has ended only once someone wants the key.
    PERFORM pg_notify('fencegate_turns', f.turn_holder || ' ' || f.key)
    FROM unnest(take_keys) AS e(k) JOIN fence_marks AS f ON f.key = e.k
    WHERE NOT (e.k = ANY(taken_keys)) AND f.turn_holder IS DISTINCT FROM holder_id;
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
        END
    FROM entry
    ORDER BY entry.i;
END
$$;

-- Renews the given turns of this holder: each turn's expiry moves to now (server clock) plus its
-- lease. Answers the keys renewed (a turn that lapsed and was taken by another holder is not).
CREATE FUNCTION fencegate_turn_renew(holder_id text, keys text[], turns bigint[], lease_ms bigint[])
RETURNS TABLE (key text)
LANGUAGE sql VOLATILE AS $$
    UPDATE fence_marks AS f
    SET turn_expires = clock_timestamp() + r.l * interval '1 millisecond'
    FROM unnest(keys, turns, lease_ms) AS r(k, t, l)
    WHERE f.key = r.k AND f.turn_holder = holder_id AND f.turn = r.t
    RETURNING f.key;
$$;
