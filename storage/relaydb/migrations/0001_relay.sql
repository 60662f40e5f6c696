-- Developers' tokens. Only a SHA-256 of the token is kept; tunnel_id is
-- drawn at creation and never changes, so the public URL is stable.
CREATE TABLE tokens (
    name        TEXT NOT NULL UNIQUE,
    token_hash  BLOB NOT NULL UNIQUE,
    tunnel_id   TEXT NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL, -- unix µs
    revoked_at  INTEGER
);

-- Relay settings remembered in the data directory (public_url).
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Requests that arrived while a tunnel had no agent, in arrival order.
CREATE TABLE queue (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT NOT NULL UNIQUE,
    tunnel_id   TEXT NOT NULL,
    arrived_at  INTEGER NOT NULL, -- unix µs
    method      TEXT NOT NULL,
    uri         TEXT NOT NULL,
    headers     BLOB NOT NULL,    -- encoded as on the wire (relay.Header)
    body        BLOB NOT NULL,
    size        INTEGER NOT NULL
);
CREATE INDEX queue_tunnel ON queue (tunnel_id, seq);
