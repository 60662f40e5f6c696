-- The intake log's position (intake.go): the record after the last one
-- applied to this database, written in the transaction that applied it.
CREATE TABLE intake_state (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    applied_gen INTEGER NOT NULL,
    applied_end INTEGER NOT NULL
);
INSERT INTO intake_state (id, applied_gen, applied_end) VALUES (1, 0, 0);
