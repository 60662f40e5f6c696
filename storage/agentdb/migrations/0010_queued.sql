-- A request that waited in the relay's queue is "queued" everywhere — relay,
-- agent, storage, API and UI — so the column that marks it takes that name.
ALTER TABLE captures RENAME COLUMN late TO queued;
DROP INDEX captures_relay_late;
CREATE UNIQUE INDEX captures_relay_queued ON captures (relay_id) WHERE queued = 1;
DROP INDEX captures_undelivered_late;
CREATE INDEX captures_undelivered_queued ON captures (seq) WHERE queued = 1 AND attempts = 0;
