// Package storage is calltap's SQLite core: opening a database (WAL, two
// pools, the driver's rules), ordered migrations, damage reports, disk-full
// detection, private file modes and the µs time columns. It is the one
// package that imports the driver (mattn/go-sqlite3) for opening and
// configuring; the packages under it keep one database each and reach
// SQLite through Open:
//
//   - storage/agentdb: the agent's database (captures, attempts, media,
//     the search index) and its answer path;
//   - storage/intake: the agent's intake log and body segment files;
//   - storage/relaydb: the relay's database;
//   - storage/servicedb: the emulated voice service's.
//
// Every database is opened in WAL mode with two pools: one connection for
// writes (SQLite allows one writer; a single connection avoids SQLITE_BUSY
// between our own goroutines) and several for reads, which WAL lets run
// beside the writer.
package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/storage/relaystate"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// Schema names one of the databases calltap keeps, in errors and in the
// migrations table's messages.
type Schema string

// busyTimeout is how long a statement waits for another connection's lock.
const busyTimeout = 10 * time.Second

// ErrNotFound is returned when a looked-up row does not exist.
var ErrNotFound = relaystate.ErrNotFound

// DB is an open SQLite database of one Schema: its connections,
// migrations and driver rules. The package that keeps the schema embeds it
// in its store, and runs its queries on Writer and Reader.
type DB struct {
	path       string
	schema     Schema
	migrations fs.FS // the schema's .sql files, at the root
	sync       SyncMode
	attach     attachment // a second file of the store, attached to the read pool; zero if none
	dsn        func(txlock, extra string) string
	write      *sql.DB // one connection: every write goes through it
	read       *sql.DB // read-only pool

	closeOnce sync.Once
	closeErr  error // set by closeOnce
}

// attachment is a database file of a store beside its main file, attached
// to its connections under a name (WithAttached).
type attachment struct {
	name string
	path string
}

// SyncMode is how far a commit goes before it returns.
type SyncMode string

const (
	// SyncFull makes every commit durable before it returns: the WAL is
	// synced at each commit (synchronous=FULL), and an agent store's body
	// segments are synced before the transaction naming them commits. A
	// batch of captures is one commit, so one sync.
	SyncFull SyncMode = "full"
	// SyncNormal syncs only at checkpoints (synchronous=NORMAL): a commit
	// survives calltap crashing, but a power cut or an OS crash may take
	// the last commits back, after they were acknowledged.
	SyncNormal SyncMode = "normal"
)

// ParseSyncMode reads a SyncMode from its name.
func ParseSyncMode(s string) (SyncMode, error) {
	switch m := SyncMode(strings.ToLower(s)); m {
	case SyncFull, SyncNormal:
		return m, nil
	}
	return "", fmt.Errorf("sync mode %q: want %q or %q", s, SyncFull, SyncNormal)
}

// Option changes how Open opens a database.
type Option func(*options)

type options struct {
	sync   SyncMode
	attach attachment
	parts  []string
}

// WithSync sets how durable commits are; the default is SyncFull.
func WithSync(m SyncMode) Option { return func(o *options) { o.sync = m } }

// WithAttached names a second database file of the store, at path: it is
// attached as name to every connection of the read pool (read-only) and
// of the pools Pool opens with attached set, made private like the main
// file, and counts as part of the store when the main file is found empty.
func WithAttached(name, path string) Option {
	return func(o *options) { o.attach = attachment{name: name, path: path}; o.parts = append(o.parts, path) }
}

// WithPart names a file or folder the store keeps beside its main file:
// if it holds data, an emptied main file is refused (checkEmpty).
func WithPart(path string) Option { return func(o *options) { o.parts = append(o.parts, path) } }

// Open opens (creating if needed) the database at path, of schema, and
// applies the migrations of it not yet applied: the .sql files at the root
// of migrations, in file-name order, each once and in its own transaction
// (a file beginning with the line "-- calltap: outside a transaction" runs
// outside one, statement by statement, and must be safe to repeat). The
// parent directory is created. The files are private (0600); an existing
// file of zero bytes is refused when files of the store it held are
// beside it (see checkEmpty); a file SQLite finds damaged is reported as a
// *DamagedError.
func Open(ctx context.Context, path string, schema Schema, migrations fs.FS, opts ...Option) (*DB, error) {
	memstatusOnce.Do(disableMemstatus)
	o := options{sync: SyncFull}
	for _, opt := range opts {
		opt(&o)
	}
	if _, err := ParseSyncMode(string(o.sync)); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("storage: create data directory: %w", err)
	}
	if err := checkEmpty(path, o.parts); err != nil {
		return nil, err
	}
	if err := privateFiles(path, o.attach.path); err != nil {
		return nil, err
	}
	dsn := func(txlock, extra string) string {
		q := url.Values{}
		q.Set("_journal_mode", "WAL")
		q.Set("_busy_timeout", strconv.Itoa(int(busyTimeout.Milliseconds())))
		q.Set("_synchronous", strings.ToUpper(string(o.sync)))
		q.Set("_foreign_keys", "on")
		q.Set("_txlock", txlock)
		return "file:" + path + "?" + q.Encode() + extra
	}
	w, err := sql.Open("sqlite3", dsn("immediate", ""))
	if err != nil {
		return nil, fmt.Errorf("storage: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	db := &DB{path: path, schema: schema, migrations: migrations, sync: o.sync, attach: o.attach, dsn: dsn, write: w}
	fail := func(err error) (*DB, error) {
		db.Close()
		db.Explain(&err)
		return nil, err
	}
	if err := connect(ctx, w); err != nil {
		return fail(fmt.Errorf("storage: open %s: %w", path, err))
	}
	if err := db.migrate(ctx); err != nil {
		return fail(err)
	}
	db.read = db.openPool(dsn("immediate", "&mode=ro&_query_only=1"), db.attach, "?mode=ro")
	n := runtime.GOMAXPROCS(0) * 2
	if n < 4 {
		n = 4
	}
	db.read.SetMaxOpenConns(n)
	db.read.SetMaxIdleConns(n)
	return db, nil
}

// Pool opens another pool of connections to the database, as the write
// connection's (txlock "immediate" or "deferred"), with the attached file
// (WithAttached, read-write, created if missing) if attached. Its owner
// sizes it and closes it.
func (db *DB) Pool(txlock string, attached bool) *sql.DB {
	if !attached {
		return db.openPool(db.dsn(txlock, ""), attachment{}, "")
	}
	return db.openPool(db.dsn(txlock, ""), db.attach, "")
}

// openPool opens a pool of connections to dsn, each with the file of a
// attached under its name, opened by its path and query (uriQuery).
func (db *DB) openPool(dsn string, a attachment, uriQuery string) *sql.DB {
	if a.path == "" {
		// sql.Open("sqlite3") fails only for an unknown driver name.
		p, _ := sql.Open("sqlite3", dsn)
		return p
	}
	return sql.OpenDB(connector{drv: &sqlite3.SQLiteDriver{ConnectHook: attach(a, "file:"+a.path+uriQuery)}, dsn: dsn})
}

// connector opens SQLite connections to dsn with drv (and its hook).
type connector struct {
	drv *sqlite3.SQLiteDriver
	dsn string
}

func (c connector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c connector) Driver() driver.Driver                        { return c.drv }

// attach attaches the file of a, opened by uri, to every new connection.
func attach(a attachment, uri string) func(*sqlite3.SQLiteConn) error {
	return func(c *sqlite3.SQLiteConn) error {
		if _, err := c.Exec(`ATTACH DATABASE ? AS `+a.name, []driver.Value{uri}); err != nil {
			return fmt.Errorf("storage: attach the %s file %s: %w", a.name, a.path, err)
		}
		return nil
	}
}

// OpenReadOnly opens the read pool of the database at path without
// writing anything: mode=ro, or, if immutable, as a file nothing changes.
// A file named WithAttached is attached, read-only, if it exists
// (immutable too if it has no WAL either). Writer is the read pool: a
// write through it fails. Nothing is migrated.
func OpenReadOnly(ctx context.Context, path string, schema Schema, migrations fs.FS, immutable bool, opts ...Option) (*DB, error) {
	memstatusOnce.Do(disableMemstatus)
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	q := url.Values{}
	q.Set("_busy_timeout", strconv.Itoa(int(busyTimeout.Milliseconds())))
	q.Set("_query_only", "1")
	q.Set("mode", "ro")
	if immutable {
		q.Set("immutable", "1")
	}
	db := &DB{path: path, schema: schema, migrations: migrations, sync: SyncFull}
	a, uriQuery := attachment{}, "?mode=ro"
	if _, err := os.Stat(o.attach.path); o.attach.path != "" && err == nil {
		a = o.attach
		if _, werr := os.Stat(a.path + "-wal"); immutable && errors.Is(werr, fs.ErrNotExist) {
			uriQuery += "&immutable=1"
		}
	}
	rdb := db.openPool("file:"+path+"?"+q.Encode(), a, uriQuery)
	rdb.SetMaxOpenConns(4)
	rdb.SetMaxIdleConns(4)
	db.read, db.write = rdb, rdb
	var n int64 // a first read, which opens the file
	if err := rdb.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
		rdb.Close()
		err = fmt.Errorf("storage: open %s read-only: %w", path, err)
		db.Explain(&err)
		return nil, err
	}
	return db, nil
}

// Writer is the database's one write connection: every write goes through
// it, so writes never meet SQLITE_BUSY between our own goroutines.
func (db *DB) Writer() *sql.DB { return db.write }

// Reader is the read-only pool, which WAL lets run beside the writer.
func (db *DB) Reader() *sql.DB { return db.read }

// Explain turns a corruption error of a query on db's own file into a
// *DamagedError that names the file and says how to recover what it
// holds; other errors, and errors already explained, are left as they
// are. Use it as defer db.Explain(&err).
func (db *DB) Explain(errp *error) {
	if err := *errp; err != nil && IsCorrupt(err) && !errors.Is(err, ErrDamaged) {
		*errp = &DamagedError{Path: db.path, Advice: RecoverAdvice(db.path), Err: err}
	}
}

// connect opens w's first connection. Switching a new database to WAL
// needs it to itself, and SQLite answers "locked" at once, without waiting
// out the busy timeout, while another process (the relay starting as
// `relay token create` runs) is doing the same: try again for as long as
// the busy timeout would have waited.
func connect(ctx context.Context, w *sql.DB) error {
	deadline := time.Now().Add(busyTimeout)
	for {
		err := w.PingContext(ctx)
		var se sqlite3.Error
		if err == nil || !errors.As(err, &se) || (se.Code != sqlite3.ErrBusy && se.Code != sqlite3.ErrLocked) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Path is the database file.
func (db *DB) Path() string { return db.path }

// SyncMode is how durable the database's commits are (WithSync).
func (db *DB) SyncMode() SyncMode { return db.sync }

// Close closes the connections. A second Close returns what the first did.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		var errs []error
		if db.read != nil && db.read != db.write {
			errs = append(errs, db.read.Close())
		}
		db.closeErr = errors.Join(append(errs, db.write.Close())...)
	})
	return db.closeErr
}

// migrate applies, in file-name order, every migration of db.schema not yet
// recorded in schema_migrations, each in its own transaction. (The
// agent's tests build databases of older schemas with a helper of their
// own, agentdb's migrateThrough.)
func (db *DB) migrate(ctx context.Context) error {
	if _, err := db.write.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)`); err != nil {
		return fmt.Errorf("storage: migrations table: %w", err)
	}
	entries, err := fs.ReadDir(db.migrations, ".")
	if err != nil {
		return fmt.Errorf("storage: the %s schema's migrations: %w", db.schema, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if err := db.migrateOne(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// outsideTx starts a migration that cannot run in a transaction (VACUUM).
// It runs statement by statement, then is recorded; one that stops half
// way runs again whole at the next open, so it must be safe to repeat.
const outsideTx = "-- calltap: outside a transaction\n"

func (db *DB) migrateOne(ctx context.Context, name string) error {
	body, err := fs.ReadFile(db.migrations, name)
	if err != nil {
		return err
	}
	if strings.HasPrefix(string(body), outsideTx) {
		return db.migrateOutsideTx(ctx, name, string(body))
	}
	tx, err := db.write.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE name = ?`, name).Scan(&n); err != nil {
		return err
	} else if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, string(body)); err != nil {
		return fmt.Errorf("storage: migration %s/%s: %w", db.schema, name, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)`, name, time.Now().UTC().Format(time.RFC3339)); err != nil {
		return err
	}
	return tx.Commit()
}

func (db *DB) migrateOutsideTx(ctx context.Context, name, body string) error {
	var n int
	if err := db.write.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE name = ?`, name).Scan(&n); err != nil {
		return err
	} else if n > 0 {
		return nil
	}
	if _, err := db.write.ExecContext(ctx, body); err != nil {
		return fmt.Errorf("storage: migration %s/%s: %w", db.schema, name, err)
	}
	_, err := db.write.ExecContext(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)`, name, time.Now().UTC().Format(time.RFC3339))
	return err
}

// Page is the paging request every collection query takes: the rules of the
// service documentation, section 4.7, are applied by the caller (api.ParsePage).
type Page struct {
	Limit  int
	Offset int
}

// PendingMigrations counts the migrations of the database's schema that it
// has not recorded (a store of an older calltap opened read-only).
func (db *DB) PendingMigrations(ctx context.Context) (int, error) {
	entries, err := fs.ReadDir(db.migrations, ".")
	if err != nil {
		return 0, err
	}
	pending := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		var n int
		if err := db.read.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE name = ?`, e.Name()).Scan(&n); err != nil {
			return 0, fmt.Errorf("storage: schema version: %w", err)
		}
		pending += 1 - n
	}
	return pending, nil
}
