package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb/searchindex"
	"github.com/calltap/calltap/storage/intake"
)

// Opening and closing an agent store: its parts (the search index, the
// checkpointer, the intake log) start in OpenAgent and stop in Close.

// OpenAgent opens (creating if needed) the agent's database at path, its
// search index and its body files. An index SQLite cannot read is deleted
// and rebuilt.
func OpenAgent(ctx context.Context, path string, opts ...Option) (_ *AgentStore, err error) {
	o := options{sync: storage.SyncFull, disk: intake.OSDisk{}, delay: defaultApplyDelay, pace: searchindex.DefaultPace()}
	for _, opt := range opts {
		opt(&o)
	}
	sdb, err := storage.Open(ctx, path, Schema, migrations, storage.WithSync(o.sync),
		storage.WithAttached("search", SearchIndexPath(path)), storage.WithPart(BodiesDir(path)))
	if err != nil {
		return nil, err
	}
	bodies := intake.NewBodies(BodiesDir(sdb.Path()), o.sync == storage.SyncFull, intake.WithDisk(o.disk))
	db := newStore(sdb, o.sync, bodies)
	defer func() {
		if err != nil {
			db.closeStore()
			sdb.Explain(&err)
		}
	}()
	// The full-text index is a file of its own (storage/agentdb/searchindex),
	// attached to every read connection.
	if db.index, err = searchindex.Open(ctx, func() *sql.DB { return sdb.Pool("deferred", true) }, path, BodiesDir(path), o.pace); err != nil {
		return nil, err
	}
	if db.ckpt, err = startCheckpointer(ctx, sdb.Pool("immediate", false)); err != nil {
		return nil, err
	}
	// What an agent killed before it applied its log left there is applied
	// now, whoever opens the store, unless that agent's successor holds it.
	if db.intake, err = openIntake(ctx, db, o.intake, o.disk, o.delay); err != nil {
		return nil, err
	}
	return db, nil
}

// Close applies what the intake log holds, then closes the store. A second
// Close returns what the first did.
func (db *AgentStore) Close() error {
	if db.intake == nil {
		return db.closeStore()
	}
	err := db.intake.close()
	if err != nil && storage.IsDiskFull(err) {
		// The log keeps what it could not apply, and the next open
		// applies it: a stop on a full disk is orderly.
		slog.Warn("storage: the disk is full: what the intake log holds and the store does not yet is applied at the next start", "err", err)
		err = nil
	}
	return errors.Join(err, db.closeStore())
}

// closeStore stops the indexer and the checkpointer and closes the
// connections and files, leaving the intake log as it is. A second call
// returns what the first did.
func (db *AgentStore) closeStore() error {
	db.closeOnce.Do(func() { db.closeErr = db.closeParts() })
	return db.closeErr
}

// The read pool closes first: the last connection to close a WAL file
// checkpoints it and deletes the WAL, which a read-only one cannot do.
func (db *AgentStore) closeParts() error {
	errs := []error{db.read.Close()} // sdb.Close closes it again, which does nothing
	if db.index != nil {
		errs = append(errs, db.index.Close())
	}
	if db.ckpt != nil {
		errs = append(errs, db.ckpt.close())
	}
	db.rawMu.Lock()
	if db.raw != nil {
		errs = append(errs, db.raw.close())
		db.raw = nil
	}
	db.rawMu.Unlock()
	errs = append(errs, db.sdb.Close())
	if db.bodies != nil {
		errs = append(errs, db.bodies.Close())
	}
	if db.index != nil {
		errs = append(errs, db.index.RemoveIfDamaged())
	}
	return errors.Join(errs...)
}
