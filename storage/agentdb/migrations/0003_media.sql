-- Recordings and transcripts the agent downloaded from the signed, short-
-- lived links of call events (and of `calltap media`), so they outlive the
-- links. The files live in the data directory's media folder; a row says
-- where each came from and how the download went.
CREATE TABLE media_files (
    seq          INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,          -- UUID; the inspector serves the file at /api/v1/ext/media/<id>
    capture_id   TEXT NOT NULL DEFAULT '',      -- capture whose payload carried the link; '' when fetched by `calltap media`
    call_id      TEXT NOT NULL DEFAULT '',
    kind         TEXT NOT NULL,                 -- recording | transcript
    source_url   TEXT NOT NULL,                 -- the signed link as received
    expires_at   INTEGER,                       -- unix µs: when the link stops working (received + expires_in)
    status       TEXT NOT NULL DEFAULT 'pending', -- pending | saved | failed
    attempts     INTEGER NOT NULL DEFAULT 0,
    error        TEXT,                          -- last failure
    file         TEXT,                          -- file name inside the media folder
    size         INTEGER,
    content_type TEXT,
    sha256       TEXT,                          -- hex
    created_at   INTEGER NOT NULL,              -- unix µs
    updated_at   INTEGER NOT NULL,
    saved_at     INTEGER
);
CREATE INDEX media_files_call ON media_files (call_id, seq);
CREATE INDEX media_files_capture ON media_files (capture_id);
CREATE INDEX media_files_source ON media_files (source_url);
