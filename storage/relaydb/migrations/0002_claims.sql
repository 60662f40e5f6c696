-- Seats of tokens several agents share (calltap listen --claim), one row
-- per claim set. A seat stays while its agent is away, so that its calls
-- queue for it (queue.tunnel_id = seat), until it is released or idle for
-- the relay's claim TTL. The default seat of a token (its tunnel id) is
-- not kept here.
CREATE TABLE claimants (
    seat        TEXT PRIMARY KEY,  -- tunnel_id "-" the claim set's key
    tunnel_id   TEXT NOT NULL,
    claims      TEXT NOT NULL,     -- JSON array of the canonical claims, sorted
    created_at  INTEGER NOT NULL,  -- unix µs, the first registration: the earlier seat wins a call both match
    seen_at     INTEGER NOT NULL,  -- unix µs, an agent last came to or left the seat
    connected   INTEGER NOT NULL CHECK (connected IN (0, 1))
);

-- Which seat each call belongs to: the one its first event went to, so
-- that its later events follow it across restarts. A call is forgotten
-- once its last event is older than the relay's call memory. Looked up by
-- its key on the request path, hence no rowid beside the key.
CREATE TABLE calls (
    tunnel_id  TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    seat       TEXT NOT NULL,
    first_at   INTEGER NOT NULL,  -- unix µs
    last_at    INTEGER NOT NULL,  -- unix µs, only moves forward
    PRIMARY KEY (tunnel_id, call_id)
) WITHOUT ROWID;
-- Forgetting calls (ExpireCalls) by their last event.
CREATE INDEX calls_last ON calls (last_at);
-- Counting recent calls by seat (CallsSince, calltap relay claims) from
-- the index alone.
CREATE INDEX calls_first ON calls (first_at, seat);
