-- The full-text index moves to a database file of its own beside this one
-- (agent-search.db for agent.db; see storage/searchindex.go), so that
-- indexing takes that file's write lock, not this one's, and runs beside
-- the capture writer. The index is derived from capture_bodies: the new
-- file starts empty and is rebuilt in the background.
DROP TABLE captures_fts;
DROP TABLE search_progress;

-- The store's identity, which the index file records: an index beside a
-- different store (a copied or restored file) is rebuilt, not trusted.
CREATE TABLE store_identity (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    uuid TEXT NOT NULL
);
INSERT INTO store_identity (id, uuid) VALUES (1, lower(hex(randomblob(16))));
