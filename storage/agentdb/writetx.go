package agentdb

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/calltap/calltap/storage"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// The store's write transactions: one at a time, under writeGate, on the
// write connection's driver connection (rawConn, writer.go), which the
// store prepares on first use; after each commit the checkpointer hears
// of it.

// writeRaw runs fn in one IMMEDIATE transaction on the write connection's
// driver connection, committing when fn succeeds and rolling back when it
// or the commit fails.
func (db *AgentStore) writeRaw(ctx context.Context, fn func(*rawConn) error) error {
	return db.writeRawDurable(ctx, true, fn)
}

// writeRawDurable is writeRaw; unless durable, the commit is not synced
// even under SyncFull (synchronous=NORMAL for this transaction): for what
// the intake log already holds, synced, and applies again after a crash.
func (db *AgentStore) writeRawDurable(ctx context.Context, durable bool, fn func(*rawConn) error) error {
	relax := !durable && db.sync == storage.SyncFull
	db.writeGate.Lock()
	defer db.writeGate.Unlock()
	conn, err := db.write.Conn(ctx)
	if err != nil {
		return fmt.Errorf("storage: write connection: %w", err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		w, err := db.rawFor(dc)
		if err != nil {
			return err
		}
		if relax {
			if _, err := w.exec(`PRAGMA synchronous = NORMAL`); err != nil {
				return fmt.Errorf("storage: %w", err)
			}
			defer w.exec(`PRAGMA synchronous = FULL`)
		}
		if _, err := w.exec(`BEGIN IMMEDIATE`); err != nil {
			return fmt.Errorf("storage: begin: %w", err)
		}
		if err := fn(w); err != nil {
			return errors.Join(err, w.rollback())
		}
		if w.bodies != nil {
			// The bodies this transaction names are durable before it is.
			if err := w.bodies.SyncWritten(); err != nil {
				return errors.Join(err, w.rollback())
			}
		}
		if _, err := w.exec(`COMMIT`); err != nil {
			return errors.Join(fmt.Errorf("storage: commit: %w", err), w.rollback())
		}
		return db.afterCommit(w)
	})
	return err
}

// rawFor returns the writer state of driver connection dc, preparing it
// on first use (or when database/sql replaced a broken connection).
func (db *AgentStore) rawFor(dc any) (*rawConn, error) {
	sc, ok := dc.(*sqlite3.SQLiteConn)
	if !ok {
		return nil, fmt.Errorf("storage: write connection is a %T, not a SQLite connection", dc)
	}
	db.rawMu.Lock()
	defer db.rawMu.Unlock()
	if db.raw != nil && db.raw.conn == sc {
		return db.raw, nil
	}
	if db.raw != nil {
		db.raw.close() // a connection database/sql dropped
		db.raw = nil
	}
	w := &rawConn{conn: sc, stmts: map[string]driver.Stmt{}, bodies: db.bodies}
	for _, q := range writerPragmas {
		if _, err := sc.Exec(q, nil); err != nil {
			return nil, fmt.Errorf("storage: %s: %w", q, err)
		}
	}
	db.raw = w
	return w, nil
}

// afterCommit is called after each commit of the capture writer, still on
// the write connection w.
func (db *AgentStore) afterCommit(w *rawConn) error {
	c := db.ckpt
	if c == nil {
		return nil
	}
	if c.needSync.Swap(false) {
		// Nothing is being written now, so this checkpoint can catch up
		// (unless a reader holds an old snapshot), and the next write
		// transaction starts the WAL over.
		var busy, frames, done int64
		if _, err := w.queryRow(`PRAGMA wal_checkpoint(PASSIVE)`, nil, &busy, &frames, &done); err != nil {
			return fmt.Errorf("storage: checkpoint: %w", err)
		}
		return nil
	}
	c.committed()
	return nil
}
