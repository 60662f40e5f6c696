package agentdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb/intakelock"
	"github.com/calltap/calltap/storage/intake"
)

// A reader is an agent store opened by a command that only reads it
// (calltap requests, export): it writes nothing, creates nothing and needs
// no room, so it works on a full disk and on a read-only copy of the data
// directory. It has the read pool alone: no write connection, indexer,
// checkpointer or intake log.
//
// It sees every request already answered. While an agent owns the store,
// the requests it answered may still be in its intake log, applied to
// SQLite within its apply delay: the reader waits until the agent has applied
// every record the log held when it opened (ownerCaughtUp), and searches
// wait for the agent's index in the same way. With no agent, records or
// an index backlog left by one that was killed are what a reader cannot
// add: Behind says how many, and the caller opens the store with
// OpenAgent (which applies them) where it can write.

// OpenAgentReader opens the agent store at path read-only. A store that
// does not exist is an error (fs.ErrNotExist).
func OpenAgentReader(ctx context.Context, path string) (*AgentStore, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	// SQLite reads a WAL database through its -wal and -shm files, and
	// makes them when they are missing: on a read-only folder or a full
	// disk it cannot. With no -wal file, the database file is the whole
	// store, and nothing is writing it (a writer would have made the
	// -wal): there it is read as a file that does not change.
	_, werr := os.Stat(path + "-wal")
	noWAL := errors.Is(werr, fs.ErrNotExist)
	sdb, err := storage.OpenReadOnly(ctx, path, Schema, migrations, noWAL && !storage.Writable(filepath.Dir(path)),
		storage.WithAttached("search", SearchIndexPath(path)))
	if err != nil {
		return nil, err
	}
	db := newStore(sdb, storage.SyncFull, intake.NewBodies(BodiesDir(path), false))
	db.reader = &reader{owned: intakelock.Held(BodiesDir(path))}
	if db.reader.migrations, err = sdb.PendingMigrations(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if db.reader.owned {
		if err := db.ownerCaughtUp(ctx); err != nil {
			db.Close()
			return nil, err
		}
	}
	return db, nil
}

// Lag is what a reader leaves out, for want of an agent to add it.
type Lag struct {
	Migrations int   // the store is an older calltap's: its format is brought up to date by a writer
	Requests   int   // requests in the intake log not applied to SQLite
	Answers    int   // handlers' answers in the intake log not applied
	Unindexed  int64 // captures not in the full-text index
}

// Behind says what a reader leaves out. It is zero while an agent owns
// the store (it adds them; the reader waited for it), and for a store
// opened with OpenAgent.
func (db *AgentStore) Behind(ctx context.Context) (Lag, error) {
	if db.reader == nil {
		return Lag{}, nil
	}
	if db.reader.migrations > 0 {
		return Lag{Migrations: db.reader.migrations}, nil // the queries below may not hold on an older format
	}
	if db.reader.owned {
		return Lag{}, nil
	}
	_, recs, err := db.logEnd(ctx)
	if err != nil {
		return Lag{}, err
	}
	var l Lag
	for _, r := range recs {
		if len(r.rec) > 0 && r.rec[0] == recInsert {
			l.Requests++
		} else {
			l.Answers++
		}
	}
	l.Unindexed, err = db.searchBacklog(ctx)
	return l, err
}

// searchBacklog is how many saved captures the full-text index lacks.
func (db *AgentStore) searchBacklog(ctx context.Context) (int64, error) {
	var last, upto int64
	if err := db.read.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM captures`).Scan(&last); err != nil {
		return 0, fmt.Errorf("storage: search backlog: %w", err)
	}
	if err := db.read.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress WHERE id = 1`).Scan(&upto); err != nil {
		return last, nil // no index (deleted, to be rebuilt): every capture is unindexed
	}
	return max(last-upto, 0), nil
}

// readerSearch is CatchUpSearch for a reader: it waits for the agent
// owning the store to index what it saved (the agent indexes once idle),
// for up to ownerWait; without one it searches the index as it is.
func (db *AgentStore) readerSearch(ctx context.Context) error {
	deadline := time.Now().Add(ownerWait)
	for {
		n, err := db.searchBacklog(ctx)
		if err != nil || n == 0 {
			return err
		}
		if !db.reader.owned || time.Now().After(deadline) {
			slog.Warn("storage: the search index lacks captures; this search leaves them out", "store", db.path, "captures", n)
			return nil
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
