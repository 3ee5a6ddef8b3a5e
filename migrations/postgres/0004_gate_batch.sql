-- The ordering gate's whole batch in one statement: release the locks given back, try the new
-- ones and, for each lock taken, either read the key's mark (a lock-only entry, token NULL) or
-- compare-and-advance it (an entry with a token, under the lock it just took). Each query in a
-- VOLATILE plpgsql function takes a new snapshot (the gate's sessions use READ COMMITTED), so the
-- reads follow the locks; the advance, like fencegate's batched one, updates the newest version
-- of the row whatever the snapshot. Answers one row per entry, in order: whether the lock was
-- taken and the mark found under it (before the entry's own advance), stored with its top bit
-- flipped; NULL when the lock was not taken or the key had no mark. An entry not taken changes
-- nothing. Keys must be distinct within a call.
CREATE FUNCTION fencegate_gate_batch(
    unlock_ids bigint[], lock_ids bigint[], mark_keys text[], tokens bigint[])
RETURNS TABLE (n integer, taken boolean, mark bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    got boolean[];
BEGIN
    PERFORM pg_advisory_unlock(u.id) FROM unnest(unlock_ids) AS u(id);
    got := ARRAY(
        SELECT pg_try_advisory_lock(l.id)
        FROM unnest(lock_ids) WITH ORDINALITY AS l(id, i)
        ORDER BY l.i);
    RETURN QUERY
    WITH entry AS (
        SELECT e.i::integer AS i, e.k AS k, e.t AS t, coalesce(got[e.i::integer], false) AS held
        FROM unnest(mark_keys, tokens) WITH ORDINALITY AS e(k, t, i)
    ), advanced AS (
        INSERT INTO fence_marks AS m (key, mark, previous_mark)
        SELECT entry.k, entry.t, NULL FROM entry
        WHERE entry.held AND entry.t IS NOT NULL
        ORDER BY entry.k
        ON CONFLICT (key) DO UPDATE
            SET previous_mark = m.mark, mark = GREATEST(m.mark, excluded.mark)
        RETURNING m.key AS k, m.previous_mark AS previous
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
