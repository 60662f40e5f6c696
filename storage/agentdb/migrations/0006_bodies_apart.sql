-- Request bodies move out of the captures row into their own table, written
-- once and never rewritten: recording a response used to rewrite the whole
-- row, a 1 MiB body included. captures keeps the body's length (size), so a
-- listing never touches bodies. The response body stays in captures, last,
-- so that reading the other columns never walks its overflow pages.
--
-- The indexes get cheaper on the way: relay_id is only looked up to drop a
-- queued (late) request the relay sent again, so only late rows are
-- indexed; replay_of is mostly NULL, so NULLs are not indexed. seq, the FTS
-- docid, is kept as it was.
CREATE TABLE capture_bodies (
    seq  INTEGER PRIMARY KEY, -- captures.seq
    body BLOB NOT NULL        -- the request body, byte-exact
);
INSERT INTO capture_bodies (seq, body) SELECT seq, body FROM captures;

CREATE TABLE captures_new (
    seq              INTEGER PRIMARY KEY,          -- insertion order; paging key; capture_bodies.seq; captures_fts.docid
    id               TEXT NOT NULL,                -- UUID shown to users (UUIDv7: time-ordered)
    relay_id         TEXT,                         -- the relay's request id; dedups redelivery of queued requests
    source           TEXT NOT NULL DEFAULT 'tunnel', -- tunnel | replay | backfill | trigger
    created_at       INTEGER NOT NULL,             -- unix µs: saved by the agent
    arrived_at       INTEGER,                      -- unix µs: reached the relay (queued requests)
    late             INTEGER NOT NULL DEFAULT 0,   -- 1 when delivered from the relay's offline queue
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
    response_body    BLOB                          -- last: see above
);
INSERT INTO captures_new (seq, id, relay_id, source, created_at, arrived_at, late, method, path, query, request_headers,
        size, target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, response_status,
        response_headers, error, duration_us, delivered_at, attempts, max_attempts, response_body)
    SELECT seq, id, relay_id, source, created_at, arrived_at, late, method, path, query, request_headers,
        octet_length(body), target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, response_status,
        response_headers, error, duration_us, delivered_at, attempts, max_attempts, response_body
    FROM captures;
DROP TABLE captures;
ALTER TABLE captures_new RENAME TO captures;

CREATE UNIQUE INDEX captures_id ON captures (id);
CREATE UNIQUE INDEX captures_relay_late ON captures (relay_id) WHERE late = 1;
CREATE INDEX captures_event ON captures (event, seq);
CREATE INDEX captures_call ON captures (call_id, seq);
CREATE INDEX captures_delivery ON captures (delivery_id, seq);
CREATE INDEX captures_replay ON captures (replay_of) WHERE replay_of IS NOT NULL;
CREATE INDEX captures_created ON captures (created_at);
CREATE INDEX captures_undelivered_late ON captures (seq) WHERE late = 1 AND attempts = 0;
