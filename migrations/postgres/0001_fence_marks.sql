-- fencegate's high-water marks, in the schema named by [store] schema (the connection's search_path).
--
-- mark holds the u64 high-water mark with its top bit flipped, so that the signed bigint orders
-- exactly like the unsigned value (0 is stored as -9223372036854775808, u64::MAX as
-- 9223372036854775807). previous_mark is the mark before the latest advance, written by the same
-- statement, so that the advance can report it atomically. fence_marks_readable shows the values.
CREATE TABLE fence_marks (
    key           text   PRIMARY KEY,
    mark          bigint NOT NULL,
    previous_mark bigint
);

CREATE VIEW fence_marks_readable AS
    SELECT key, (mark::numeric + 9223372036854775808) AS mark
    FROM fence_marks;

CREATE TABLE fencegate_meta (
    name  text PRIMARY KEY,
    value text NOT NULL
);
