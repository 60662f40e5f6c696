-- calltap: outside a transaction
-- Deleted captures free pages; with auto_vacuum off they stay in the file
-- (on the freelist) for ever. Incremental mode lets the pruner hand them
-- back to the file system a few at a time (PRAGMA incremental_vacuum),
-- without the full-file rewrite of VACUUM. Switching the mode of a
-- database that has tables takes one VACUUM, which cannot run inside a
-- transaction: this migration runs outside one (see migrateOne).
PRAGMA auto_vacuum = INCREMENTAL;
VACUUM;
