package agentdb

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/intake"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// The capture writer runs on the driver's connection itself, reached
// through sql.Conn.Raw, with statements prepared once and executed with
// context.Background(). Through database/sql every statement of a
// transaction starts a goroutine (database/sql watches the transaction's
// context for each Query, and the driver starts an interrupt watcher for
// any cancellable context); at 256 captures a batch those wake-ups cost
// more than the SQL. There is still one write connection: the raw writer
// holds it, through sql.Conn, for the length of a batch, as a transaction
// did.

// rawConn is the write connection's driver connection with the writer's
// prepared statements.
type rawConn struct {
	conn   *sqlite3.SQLiteConn
	stmts  map[string]driver.Stmt
	args   []driver.NamedValue // reused between statements
	bodies *intake.Bodies      // where large bodies go
}

// writerPragmas are set on the write connection of an agent database when
// the raw writer first sees it: checkpoints leave the commit path for the
// checkpointer (see checkpoint.go), and index inserts into a large store
// find their pages in a larger cache.
var writerPragmas = []string{
	`PRAGMA wal_autocheckpoint = 0`,
	`PRAGMA cache_size = -32768`, // KiB
	fmt.Sprintf(`PRAGMA journal_size_limit = %d`, walKeep),
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

func (w *rawConn) close() error {
	var errs []error
	for _, st := range w.stmts {
		errs = append(errs, st.Close())
	}
	w.stmts = nil
	return errors.Join(errs...)
}

// stmt returns query prepared on w's connection.
func (w *rawConn) stmt(query string) (driver.Stmt, error) {
	if st, ok := w.stmts[query]; ok {
		return st, nil
	}
	st, err := w.conn.Prepare(query)
	if err != nil {
		return nil, fmt.Errorf("storage: prepare %.40q: %w", query, err)
	}
	w.stmts[query] = st
	return st, nil
}

func (w *rawConn) named(args []driver.Value) []driver.NamedValue {
	w.args = w.args[:0]
	for i, a := range args {
		w.args = append(w.args, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	return w.args
}

// exec runs a prepared statement and returns the last inserted rowid.
func (w *rawConn) exec(query string, args ...driver.Value) (int64, error) {
	st, err := w.stmt(query)
	if err != nil {
		return 0, err
	}
	// context.Background(): the driver then runs the statement on this
	// goroutine, with no watcher.
	res, err := st.(driver.StmtExecContext).ExecContext(context.Background(), w.named(args))
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// queryRow runs a prepared query and scans its first row into dest
// (*int64, *string; NULL scans as zero). ok is false when there is no row.
func (w *rawConn) queryRow(query string, args []driver.Value, dest ...any) (ok bool, err error) {
	st, err := w.stmt(query)
	if err != nil {
		return false, err
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(context.Background(), w.named(args))
	if err != nil {
		return false, err
	}
	defer func() {
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}()
	vals := make([]driver.Value, len(rows.Columns()))
	if err := rows.Next(vals); errors.Is(err, io.EOF) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if len(vals) < len(dest) {
		return false, fmt.Errorf("storage: %d columns for %d destinations", len(vals), len(dest))
	}
	for i, d := range dest {
		switch d := d.(type) {
		case *int64:
			n, _ := vals[i].(int64)
			*d = n
		case *string:
			switch v := vals[i].(type) {
			case string:
				*d = v
			case []byte:
				*d = string(v)
			default:
				*d = ""
			}
		default:
			return false, fmt.Errorf("storage: cannot scan into %T", d)
		}
	}
	return true, nil
}

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

// rollback ends a failed transaction, if SQLite has not already.
func (w *rawConn) rollback() error {
	if w.conn.AutoCommit() {
		return nil // SQLite rolled back already (or never began)
	}
	if _, err := w.exec(`ROLLBACK`); err != nil {
		return fmt.Errorf("storage: rollback: %w", err)
	}
	return nil
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
