-- Large request bodies leave the database for segment files beside it
-- (agent-bodies/ beside agent.db; see storage/bodyfile.go): written once,
-- instead of into the WAL and again by the checkpoint. When file is set,
-- the body is the size bytes (captures.size) at file_offset in that
-- segment, and this row's body is empty.
ALTER TABLE capture_bodies ADD COLUMN file TEXT;
ALTER TABLE capture_bodies ADD COLUMN file_offset INTEGER;
