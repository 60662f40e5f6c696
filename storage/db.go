// Package storage is calltap's SQLite layer: the only package that imports
// the driver (mattn/go-sqlite3); the packages under it (storage/relaydb,
// storage/servicedb) reach SQLite through it. It holds the core every
// database shares — opening, ordered migrations, driver rules, damage
// reports, Close — and the agent's database: captures, attempts, media, the
// search index, large bodies and the intake log (AgentStore, OpenAgent).
//
// The relay's database (storage/relaydb) and the emulated voice service's
// (storage/servicedb) are packages of their own, opened with Open: each
// embeds its migrations, and runs its queries on the *DB that Open returns.
// Their method sets are disjoint from the agent's: a relay query on the
// agent's store does not compile.
//
// Every database is opened in WAL mode with two pools: one connection for
// writes (SQLite allows one writer; a single connection avoids SQLITE_BUSY
// between our own goroutines) and several for reads, which WAL lets run
// beside the writer.
package storage

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
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

//go:embed migrations/agent/*.sql
var agentMigrationFiles embed.FS

// agentMigrations are the agent's migrations, at the root.
var agentMigrations = func() fs.FS {
	sub, err := fs.Sub(agentMigrationFiles, "migrations/agent")
	if err != nil {
		panic(err) // a constant, valid path: fs.Sub cannot refuse it
	}
	return sub
}()

// Schema names one of the databases calltap keeps, in errors and in
// what the core does for it: the agent's (SchemaAgent) has parts of its own
// (search index, body files), which every other schema goes without.
type Schema string

// SchemaAgent is the agent's database: captures, attempts, media (calltap
// listen / dev).
const SchemaAgent Schema = "agent"

// busyTimeout is how long a statement waits for another connection's lock.
const busyTimeout = 10 * time.Second

// ErrNotFound is returned when a looked-up row does not exist.
var ErrNotFound = relaystate.ErrNotFound

// core is what every store shares: an open SQLite database of one Schema,
// its connections, migrations and driver rules. The agent's parts (raw
// writer, checkpointer, search index, body segments) stay nil for the
// other schemas.
type core struct {
	path       string
	schema     Schema
	migrations fs.FS // the schema's .sql files, at the root
	sync       SyncMode
	write      *sql.DB // one connection: every write goes through it
	read       *sql.DB // read-only pool

	rawMu sync.Mutex
	raw   *rawConn // the capture writer's driver connection; see writer.go

	// writeGate is held by the capture writer's transactions and by
	// deletions, which run on the indexer's connection: SQLite's busy wait
	// polls and is not fair, so a writer committing back to back could
	// keep a deletion waiting past busyTimeout; the gate queues them.
	writeGate sync.Mutex

	ckpt *checkpointer // agent databases: WAL checkpoints off the commit path

	index *indexer // agent databases: the full-text index, a file of its own

	bodies *bodyStore // agent databases: large request bodies (bodyfile.go)

	closeOnce sync.Once
	closeErr  error // set by closeOnce
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
	intake bool
}

// WithIntake makes the agent store keep an intake log (see intake.go) for
// LogCaptures: the agent's answer path. One process at a time holds it.
func WithIntake() Option { return func(o *options) { o.intake = true } }

// WithSync sets how durable commits are; the default is SyncFull.
func WithSync(m SyncMode) Option { return func(o *options) { o.sync = m } }

// AgentStore is the agent's database: captures, attempts, media, the
// search index and large bodies (calltap listen, dev).
type AgentStore struct {
	*core
	intake *intake // nil unless opened WithIntake (and no other process holds the log)
	reader *reader // set by OpenAgentReader: a read-only store (reader.go)
}

// OpenAgent opens (creating if needed) the agent's database at path.
func OpenAgent(ctx context.Context, path string, opts ...Option) (*AgentStore, error) {
	c, err := open(ctx, path, SchemaAgent, agentMigrations, opts...)
	if err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	db := &AgentStore{core: c}
	// What an agent killed before it applied its log left there is applied
	// now, whoever opens the store, unless that agent's successor holds it.
	if db.intake, err = openIntake(ctx, db, o.intake); err != nil {
		c.Close()
		return nil, err
	}
	return db, nil
}

// Close applies what the intake log holds, then closes the store. A second
// Close returns what the first did.
func (db *AgentStore) Close() error {
	if db.intake == nil {
		return db.core.Close()
	}
	err := db.intake.close()
	if err != nil && IsDiskFull(err) {
		// The log keeps what it could not apply, and the next open
		// applies it: a stop on a full disk is orderly.
		slog.Warn("storage: the disk is full: what the intake log holds and the store does not yet is applied at the next start", "err", err)
		err = nil
	}
	return errors.Join(err, db.core.Close())
}

// DB is an open database of a schema that a package of its own keeps
// (storage/relaydb, storage/servicedb): that package embeds it in its
// store, and runs its queries on Writer and Reader. Path, SyncMode and
// Close are the core's.
type DB struct{ *core }

// Open opens (creating if needed) the database at path, of schema, and
// applies the migrations of it not yet applied: the .sql files at the root
// of migrations, in file-name order, each once and in its own transaction
// (a file beginning with the line "-- calltap: outside a transaction" runs
// outside one, statement by statement, and must be safe to repeat). Every
// rule of the core holds: the files are private (0600), an emptied file is
// refused, a damaged one is a *DamagedError. The agent's database has
// parts of its own and opens with OpenAgent.
func Open(ctx context.Context, path string, schema Schema, migrations fs.FS, opts ...Option) (*DB, error) {
	if schema == SchemaAgent {
		return nil, fmt.Errorf("storage: the %s database opens with OpenAgent", schema)
	}
	c, err := open(ctx, path, schema, migrations, opts...)
	if err != nil {
		return nil, err
	}
	return &DB{c}, nil
}

// Writer is the database's one write connection: every write goes through
// it, so writes never meet SQLITE_BUSY between our own goroutines.
func (db *DB) Writer() *sql.DB { return db.write }

// Reader is the read-only pool, which WAL lets run beside the writer.
func (db *DB) Reader() *sql.DB { return db.read }

// Explain turns a corruption error of a query on db's own file into a
// *DamagedError that names the file and says how to recover what it
// holds; other errors are left as they are. Use it as defer
// db.Explain(&err).
func (db *DB) Explain(errp *error) { db.explain(errp) }

// open opens (creating if needed) the database at path and applies any
// of schema's migrations not yet applied. The parent directory is created.
//
// An existing file of zero bytes is refused when files of the store it
// held are beside it (see checkEmpty); a file SQLite finds damaged is
// reported as a *DamagedError. An agent store's search index that SQLite
// cannot read is deleted and rebuilt.
func open(ctx context.Context, path string, schema Schema, migrations fs.FS, opts ...Option) (*core, error) {
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
	if err := checkEmpty(path, schema); err != nil {
		return nil, err
	}
	if err := privateFiles(path, schema); err != nil {
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
	db := &core{path: path, schema: schema, migrations: migrations, sync: o.sync, write: w}
	fail := func(err error) (*core, error) {
		db.Close()
		db.explain(&err)
		return nil, err
	}
	if err := connect(ctx, w); err != nil {
		return fail(fmt.Errorf("storage: open %s: %w", path, err))
	}
	if err := db.migrate(ctx); err != nil {
		return fail(err)
	}
	readDSN := dsn("immediate", "&mode=ro&_query_only=1")
	if schema == SchemaAgent {
		db.bodies = newBodyStore(BodiesDir(path), o.sync == SyncFull)
		// The full-text index is a file of its own (see searchindex.go),
		// attached to every read connection.
		if db.index, err = openIndexer(ctx, dsn("deferred", ""), path); err != nil {
			return fail(err)
		}
		drv := &sqlite3.SQLiteDriver{ConnectHook: attachSearch(SearchIndexPath(path), true)}
		db.read = sql.OpenDB(connector{drv: drv, dsn: readDSN})
	} else if db.read, err = sql.Open("sqlite3", readDSN); err != nil {
		return fail(fmt.Errorf("storage: open %s read-only: %w", path, err))
	}
	n := runtime.GOMAXPROCS(0) * 2
	if n < 4 {
		n = 4
	}
	db.read.SetMaxOpenConns(n)
	db.read.SetMaxIdleConns(n)
	if schema == SchemaAgent {
		if db.ckpt, err = startCheckpointer(ctx, dsn("immediate", "")); err != nil {
			return fail(err)
		}
	}
	return db, nil
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
func (db *core) Path() string { return db.path }

// SyncMode is how durable the database's commits are (WithSync).
func (db *core) SyncMode() SyncMode { return db.sync }

// Close stops the indexer and the checkpointer and closes the connections.
// A second Close returns what the first did.
func (db *core) Close() error {
	db.closeOnce.Do(func() { db.closeErr = db.close() })
	return db.closeErr
}

func (db *core) close() error {
	var errs []error
	if db.read != nil {
		errs = append(errs, db.read.Close())
	}
	if db.index != nil {
		errs = append(errs, db.index.close())
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
	errs = append(errs, db.write.Close())
	if db.bodies != nil {
		errs = append(errs, db.bodies.close())
	}
	if db.index != nil {
		errs = append(errs, db.index.removeIfDamaged(db.path))
	}
	return errors.Join(errs...)
}

// migrate applies, in file-name order, every migration of db.schema not yet
// recorded in schema_migrations, each in its own transaction.
func (db *core) migrate(ctx context.Context) error { return db.migrateThrough(ctx, "") }

// migrateThrough applies the migrations up to and including the file named
// last ("": all of them); tests build databases of older schemas with it.
func (db *core) migrateThrough(ctx context.Context, last string) error {
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
		if last != "" && name > last {
			break
		}
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

func (db *core) migrateOne(ctx context.Context, name string) error {
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

func (db *core) migrateOutsideTx(ctx context.Context, name, body string) error {
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

// nullString maps "" to NULL so that optional text columns stay NULL.
func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

// Page is the paging request every collection query takes: the rules of the
// service documentation, section 4.7, are applied by the caller (api.ParsePage).
type Page struct {
	Limit  int
	Offset int
}
