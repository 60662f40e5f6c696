-- Every request the agent received (through the tunnel, a replay, a backfill
-- or a trigger), byte-exact, with the local handler's response.
CREATE TABLE captures (
    seq              INTEGER PRIMARY KEY,          -- insertion order; paging key
    id               TEXT NOT NULL UNIQUE,         -- UUID shown to users
    relay_id         TEXT UNIQUE,                  -- the relay's request id; dedups redelivery of queued requests
    source           TEXT NOT NULL DEFAULT 'tunnel', -- tunnel | replay | backfill | trigger
    created_at       INTEGER NOT NULL,             -- unix µs: saved by the agent
    arrived_at       INTEGER,                      -- unix µs: reached the relay (queued requests)
    late             INTEGER NOT NULL DEFAULT 0,   -- 1 when delivered from the relay's offline queue
    method           TEXT NOT NULL,
    path             TEXT NOT NULL,
    query            TEXT NOT NULL DEFAULT '',
    request_headers  TEXT NOT NULL DEFAULT '[]',   -- JSON [[name, value], ...] in arrival order
    body             BLOB NOT NULL,
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
    response_body    BLOB,
    error            TEXT,
    duration_us      INTEGER,
    delivered_at     INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX captures_event ON captures (event, seq);
CREATE INDEX captures_call ON captures (call_id, seq);
CREATE INDEX captures_delivery ON captures (delivery_id, seq);
CREATE INDEX captures_replay ON captures (replay_of);
CREATE INDEX captures_created ON captures (created_at);

-- Full-text index of request bodies (FTS4 is built into the driver by
-- default; FTS5 would need a build tag). docid = captures.seq.
CREATE VIRTUAL TABLE captures_fts USING fts4 (body, tokenize=unicode61);

-- Every try at delivering a capture to the local handler (replays with the
-- service's retry schedule make several).
CREATE TABLE attempts (
    capture_id      TEXT NOT NULL,
    n               INTEGER NOT NULL,
    at              INTEGER NOT NULL, -- unix µs
    response_status INTEGER,
    error           TEXT,
    duration_us     INTEGER,
    PRIMARY KEY (capture_id, n)
);
