package agentdb

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/calltap/calltap/storage/intake"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// The capture writer runs on the driver's connection itself, reached
// through sql.Conn.Raw (writetx.go), with statements prepared once and
// executed with context.Background(). Through database/sql every
// statement of a transaction starts a goroutine (database/sql watches
// the transaction's context for each Query, and the driver starts an
// interrupt watcher for any cancellable context); at 256 captures a
// batch those wake-ups cost more than the SQL. There is still one write
// connection: the raw writer holds it, through sql.Conn, for the length
// of a batch, as a transaction did.

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
