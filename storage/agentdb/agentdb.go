// Package agentdb is the agent's database: captures, their attempts and
// bodies, media, calls, the full-text search index (a file of its own),
// retention and deletes, and the answer path's writers: WriteCaptures,
// and LogCaptures through the intake log. It opens the database through
// the SQLite core (storage.Open) and runs its writes on the write
// connection's driver connection (writer.go).
//
// The capture record the intake log carries (intakerecord.go) is this
// package's: the log itself deals in opaque payloads.
package agentdb

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb/searchindex"
	"github.com/calltap/calltap/storage/intake"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrations are the agent's migrations, at the root.
var migrations = func() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // a constant, valid path: fs.Sub cannot refuse it
	}
	return sub
}()

// Schema is the agent's database: captures, attempts, media (calltap
// listen / dev).
const Schema storage.Schema = "agent"

// Page is the paging request every collection query takes (storage.Page).
type Page = storage.Page

// ErrNotFound is returned when a looked-up row does not exist.
var ErrNotFound = storage.ErrNotFound

// Option changes how OpenAgent opens the store.
type Option func(*options)

type options struct {
	sync   storage.SyncMode
	intake bool
	disk   intake.Disk      // writes and syncs the intake log and body files; a test's option sets another
	pace   searchindex.Pace // how the search index keeps pace with the writer
	delay  time.Duration    // the intake log's apply delay (defaultApplyDelay); a test's option sets another
}

// WithIntake makes the agent store keep an intake log (see intake.go) for
// LogCaptures: the agent's answer path. One process at a time holds it.
func WithIntake() Option { return func(o *options) { o.intake = true } }

// WithSync sets how durable commits are; the default is storage.SyncFull.
func WithSync(m storage.SyncMode) Option { return func(o *options) { o.sync = m } }

// WithSearchBacklogMax sets the bound of the search index's backlog
// (default 50,000): past it the indexer works beside the writer, which it
// holds to its pace; 0 indexes every capture as soon as it is saved.
func WithSearchBacklogMax(n int64) Option { return func(o *options) { o.pace.BacklogMax = n } }

// AgentStore is the agent's database: captures, attempts, media, the
// search index and large bodies (calltap listen, dev).
type AgentStore struct {
	sdb   *storage.DB // the SQLite core: connections, migrations
	path  string
	sync  storage.SyncMode
	write *sql.DB // sdb's one write connection
	read  *sql.DB // sdb's read pool

	rawMu sync.Mutex
	raw   *rawConn // guarded by rawMu: the capture writer's driver connection; see writer.go

	// writeGate is held by the capture writer's transactions and by
	// deletions, which run on the indexer's connection: SQLite's busy wait
	// polls and is not fair, so a writer committing back to back could
	// keep a deletion waiting past busyTimeout; the gate queues them.
	writeGate sync.Mutex

	ckpt   *checkpointer        // WAL checkpoints off the commit path; nil when read-only
	index  *searchindex.Indexer // the full-text index, a file of its own; nil when read-only
	bodies *intake.Bodies       // large request bodies (storage/intake)

	intake *intakeLog // nil unless opened WithIntake (and no other process holds the log)
	reader *reader    // set by OpenAgentReader: a read-only store (reader.go)

	closeOnce sync.Once
	closeErr  error // set by closeOnce
}

// newStore is the AgentStore on the core sdb, its parts not yet open.
func newStore(sdb *storage.DB, sync storage.SyncMode, bodies *intake.Bodies) *AgentStore {
	return &AgentStore{sdb: sdb, path: sdb.Path(), sync: sync, write: sdb.Writer(), read: sdb.Reader(),
		bodies: bodies}
}

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

// Path is the database file.
func (db *AgentStore) Path() string { return db.path }

// SyncMode is how durable the database's commits are (WithSync).
func (db *AgentStore) SyncMode() storage.SyncMode { return db.sync }

// explain turns a corruption error of a query on the store's file into a
// *storage.DamagedError. Use it as defer db.explain(&err).
func (db *AgentStore) explain(errp *error) { db.sdb.Explain(errp) }

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
