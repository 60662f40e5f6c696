-- The full-text index kept a second copy of every body. A contentless FTS4
-- table keeps only the index (the text is in captures.body), halving what a
-- capture writes. docid = captures.seq, as before.
DROP TABLE captures_fts;
CREATE VIRTUAL TABLE captures_fts USING fts4 (content="", body, tokenize=unicode61);
INSERT INTO captures_fts (docid, body)
    SELECT seq, CAST(body AS TEXT) FROM captures WHERE length(body) BETWEEN 1 AND 1048576;
