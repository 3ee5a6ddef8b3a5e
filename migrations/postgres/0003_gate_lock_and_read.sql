-- The ordering gate's batched entry with its re-check folded in: for each key, try its advisory
-- lock and, when taken, read its mark. Each query in a VOLATILE plpgsql function takes a new
-- snapshot (under READ COMMITTED, which the gate's lock sessions set), so the read sees every
-- advance committed before the lock was taken; one SELECT around pg_try_advisory_lock would read
-- a snapshot from before it. Answers one row per key, in order; mark is the stored (top bit
-- flipped) value, NULL when the lock was not taken or the key has no mark.
CREATE FUNCTION fencegate_lock_and_read(lock_ids bigint[], mark_keys text[])
RETURNS TABLE (n integer, taken boolean, mark bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(lock_ids, 1), 0) LOOP
        n := i;
        taken := pg_try_advisory_lock(lock_ids[i]);
        mark := NULL;
        IF taken THEN
            SELECT m.mark INTO mark FROM fence_marks AS m WHERE m.key = mark_keys[i];
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
