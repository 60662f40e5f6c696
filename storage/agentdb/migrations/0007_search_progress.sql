-- Full-text indexing leaves the commit path: a capture is saved first and
-- added to captures_fts later, in batches (see storage/searchindex.go).
-- indexed_upto is the newest seq up to which every capture has been
-- looked at by the indexer; everything saved before this migration was
-- indexed as it was written.
CREATE TABLE search_progress (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    indexed_upto INTEGER NOT NULL
);
INSERT INTO search_progress (id, indexed_upto) SELECT 1, coalesce(max(seq), 0) FROM captures;
