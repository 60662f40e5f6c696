-- The emulated voice service (calltap mock-service): the organisation's
-- contacts, the calls it placed, every webhook delivery with each attempt,
-- and its own settings. Times are unix µs.

-- Settings the emulator keeps across restarts (the media signing secret).
CREATE TABLE service_settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The organisation's contacts. custom_fields is a JSON object; search
-- filters on a custom field read it with json_extract.
CREATE TABLE contacts (
    seq           INTEGER PRIMARY KEY,          -- creation order; paging key
    id            TEXT NOT NULL UNIQUE,         -- UUID
    name          TEXT NOT NULL DEFAULT '',
    phone         TEXT NOT NULL DEFAULT '',
    email         TEXT NOT NULL DEFAULT '',
    custom_fields TEXT NOT NULL DEFAULT '{}',
    created_at    INTEGER NOT NULL
);
CREATE INDEX contacts_phone ON contacts (phone);

-- Calls placed through dispatch (or made up by --seed).
CREATE TABLE calls (
    seq           INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,         -- call_id (UUID)
    scenario      TEXT NOT NULL,                -- completed | failed:busy | failed:no_answer | failed:dispatch_error
    from_number   TEXT NOT NULL,
    to_number     TEXT NOT NULL,
    contact_id    TEXT NOT NULL DEFAULT '',
    contact_name  TEXT NOT NULL DEFAULT '',
    agent_name    TEXT NOT NULL DEFAULT '',
    webhook_url   TEXT NOT NULL DEFAULT '',
    dispatched_at INTEGER NOT NULL,
    recording_at  INTEGER                       -- wall time the recording is ready; NULL: never (failed call)
);

-- One row per event delivery. A row is written at dispatch for every event
-- the call will send; created_at is when the event is due, and a row is
-- invisible to the API until then. Retries and replays re-send payload
-- unchanged. round counts replays: an attempt that finishes after a replay
-- reset the budget does not overwrite the new round's state.
CREATE TABLE deliveries (
    seq             INTEGER PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,       -- delivery id = the payload's id
    call_id         TEXT NOT NULL,
    event           TEXT NOT NULL,
    url             TEXT NOT NULL,
    headers         TEXT NOT NULL DEFAULT '[]', -- JSON [[name, value], ...]: event_webhook_headers
    payload         BLOB NOT NULL,              -- the exact bytes sent
    status          TEXT NOT NULL DEFAULT 'pending', -- pending | delivered | failed
    attempts        INTEGER NOT NULL DEFAULT 0, -- attempts in the current round
    max_attempts    INTEGER NOT NULL DEFAULT 5,
    round           INTEGER NOT NULL DEFAULT 0, -- 0, then +1 per replay
    next_at         INTEGER,                    -- next attempt due; NULL: none
    inflight        INTEGER NOT NULL DEFAULT 0, -- 1 while an attempt runs
    response_status INTEGER,
    response_body   BLOB,
    error           TEXT NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL,
    delivered_at    INTEGER
);
CREATE INDEX deliveries_created ON deliveries (created_at, seq);
CREATE INDEX deliveries_call ON deliveries (call_id, created_at);
CREATE INDEX deliveries_due ON deliveries (next_at) WHERE next_at IS NOT NULL;

-- Every attempt at every delivery, across replays.
CREATE TABLE delivery_attempts (
    delivery_id     TEXT NOT NULL,
    n               INTEGER NOT NULL,           -- 1, 2, ... over the delivery's life
    round           INTEGER NOT NULL,           -- deliveries.round at the time
    try             INTEGER NOT NULL,           -- 1..max_attempts within the round
    at              INTEGER NOT NULL,
    response_status INTEGER,
    response_body   BLOB,
    error           TEXT NOT NULL DEFAULT '',
    duration_us     INTEGER NOT NULL,
    PRIMARY KEY (delivery_id, n)
);
