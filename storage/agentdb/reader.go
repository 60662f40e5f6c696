package agentdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/calltap/calltap/storage"
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

// ownerWait bounds how long a reader waits for a live agent to apply its
// log or index its captures: the agent applies within its apply delay, and
// retries a failed apply (a full disk) every second.
const ownerWait = 5 * time.Second

// reader is what an AgentStore opened by OpenAgentReader knows.
type reader struct {
	owned      bool // a live agent owned the intake log when the store was opened
	migrations int  // migrations of this calltap the store lacks: it was written by an older one
}

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
	db.reader = &reader{owned: intakeOwned(BodiesDir(path))}
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

// ownerCaughtUp waits until the agent owning the intake log has applied
// every record the log holds now: every request it has answered. After
// ownerWait it gives up with a warning, and the read goes on without
// what is left: reading must not fail because the agent cannot write.
func (db *AgentStore) ownerCaughtUp(ctx context.Context) error {
	target, recs, err := db.logEnd(ctx)
	if err != nil || len(recs) == 0 {
		return err
	}
	deadline := time.Now().Add(ownerWait)
	for {
		at, err := db.appliedPos(ctx)
		if err != nil {
			return err
		}
		if !at.before(target) {
			return nil
		}
		if time.Now().After(deadline) {
			slog.Warn("storage: the agent running on this store has not applied requests it answered; this read leaves them out",
				"store", db.path, "records", len(recs))
			return nil
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// appliedPos is the intake position recorded in the store.
func (db *AgentStore) appliedPos(ctx context.Context) (pos, error) {
	var p pos
	if err := db.read.QueryRowContext(ctx, `SELECT applied_gen, applied_end FROM intake_state`).Scan(&p.gen, &p.off); err != nil {
		return p, fmt.Errorf("storage: intake position: %w", err)
	}
	return p, nil
}

// before reports whether p comes before q in the log.
func (p pos) before(q pos) bool {
	return p.gen < q.gen || (p.gen == q.gen && p.off < q.off)
}

// logEnd reads the intake log, without writing, from the recorded
// position: it returns the end of its last whole record and the records
// past the position.
func (db *AgentStore) logEnd(ctx context.Context) (end pos, records []logged, err error) {
	applied, err := db.appliedPos(ctx)
	if err != nil {
		return pos{}, nil, err
	}
	dir := BodiesDir(db.path)
	gens, err := intake.Files(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return applied, nil, nil
	} else if err != nil {
		return pos{}, nil, err
	}
	end = applied
	for _, g := range gens {
		if g < applied.gen {
			continue
		}
		start := int64(0)
		if g == applied.gen {
			start = applied.off
		}
		// Damage past the last whole record is a write in progress (the
		// agent's) or a torn tail its next start cuts: not ours to judge.
		scan, err := intake.ReadLog(filepath.Join(dir, intake.Name(g)), start)
		if errors.Is(err, fs.ErrNotExist) {
			continue // applied and deleted meanwhile
		} else if err != nil {
			return pos{}, nil, err
		}
		if recs := loggedOf(g, scan.Records); len(recs) > 0 {
			end, records = recs[len(recs)-1].end, append(records, recs...)
		}
	}
	return end, records, nil
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

// probeLock reports whether another process holds the flock of the file
// at path, by taking a shared lock for a moment.
func probeLock(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	return errors.Is(err, syscall.EWOULDBLOCK)
}
