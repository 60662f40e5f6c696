-- Captures can now be deleted (calltap delete, retention). Two changes:
--
-- seq becomes AUTOINCREMENT: without it SQLite gives a new row max(seq)+1,
-- so deleting the newest capture would hand its seq to the next one, and
-- seq is the search index's docid and its progress mark (indexed_upto): a
-- reused seq would be skipped by the indexer, and its index entry removed
-- twice. sqlite_sequence starts at the highest seq ever used.
--
-- keep marks a capture that retention never prunes (calltap keep, the
-- inspector); only an explicit delete removes it.
CREATE TABLE captures_new (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT, -- insertion order, never reused; paging key; capture_bodies.seq; search docid
    id               TEXT NOT NULL,                -- UUID shown to users (UUIDv7: time-ordered)
    relay_id         TEXT,                         -- the relay's request id; dedups redelivery of queued requests
    source           TEXT NOT NULL DEFAULT 'tunnel', -- tunnel | replay | backfill | trigger | import
    created_at       INTEGER NOT NULL,             -- unix µs: saved by the agent
    arrived_at       INTEGER,                      -- unix µs: reached the relay (queued requests)
    queued           INTEGER NOT NULL DEFAULT 0,   -- 1 when delivered from the relay's offline queue
    method           TEXT NOT NULL,
    path             TEXT NOT NULL,
    query            TEXT NOT NULL DEFAULT '',
    request_headers  TEXT NOT NULL DEFAULT '[]',   -- JSON [[name, value], ...] in arrival order
    size             INTEGER NOT NULL DEFAULT 0,   -- bytes of the request body (in capture_bodies)
    target           TEXT NOT NULL DEFAULT '',     -- URL it was forwarded to
    event            TEXT,                         -- call event kind, when the body is one
    call_id          TEXT,
    delivery_id      TEXT,                         -- the payload's id
    occurred_at      TEXT,
    duplicate_of     TEXT,                         -- id of the first capture with the same delivery_id
    replay_of        TEXT,                         -- id of the capture this one re-sent
    status           TEXT NOT NULL DEFAULT 'pending', -- pending | delivered | failed
    response_status  INTEGER,
    response_headers TEXT,
    error            TEXT,
    duration_us      INTEGER,
    delivered_at     INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 1,
    keep             INTEGER NOT NULL DEFAULT 0,   -- 1: retention leaves it
    response_body    BLOB                          -- last: reading the other columns never walks its overflow pages
);
INSERT INTO captures_new (seq, id, relay_id, source, created_at, arrived_at, queued, method, path, query, request_headers,
        size, target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, response_status,
        response_headers, error, duration_us, delivered_at, attempts, max_attempts, response_body)
    SELECT seq, id, relay_id, source, created_at, arrived_at, queued, method, path, query, request_headers,
        size, target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, response_status,
        response_headers, error, duration_us, delivered_at, attempts, max_attempts, response_body
    FROM captures;
DROP TABLE captures;
ALTER TABLE captures_new RENAME TO captures;

CREATE UNIQUE INDEX captures_id ON captures (id);
CREATE UNIQUE INDEX captures_relay_queued ON captures (relay_id) WHERE queued = 1;
CREATE INDEX captures_event ON captures (event, seq);
CREATE INDEX captures_call ON captures (call_id, seq);
CREATE INDEX captures_delivery ON captures (delivery_id, seq);
CREATE INDEX captures_replay ON captures (replay_of) WHERE replay_of IS NOT NULL;
CREATE INDEX captures_created ON captures (created_at);
CREATE INDEX captures_undelivered_queued ON captures (seq) WHERE queued = 1 AND attempts = 0;
CREATE INDEX captures_kept ON captures (seq) WHERE keep = 1;
CREATE INDEX capture_bodies_file ON capture_bodies (file) WHERE file IS NOT NULL; -- is a segment still used?
