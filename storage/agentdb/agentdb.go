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
	"database/sql"
	"embed"
	"io/fs"
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

// reader is what an AgentStore opened by OpenAgentReader knows.
type reader struct {
	owned      bool // a live agent owned the intake log when the store was opened
	migrations int  // migrations of this calltap the store lacks: it was written by an older one
}

// newStore is the AgentStore on the core sdb, its parts not yet open.
func newStore(sdb *storage.DB, sync storage.SyncMode, bodies *intake.Bodies) *AgentStore {
	return &AgentStore{sdb: sdb, path: sdb.Path(), sync: sync, write: sdb.Writer(), read: sdb.Reader(),
		bodies: bodies}
}

// Path is the database file.
func (db *AgentStore) Path() string { return db.path }

// SyncMode is how durable the database's commits are (WithSync).
func (db *AgentStore) SyncMode() storage.SyncMode { return db.sync }

// explain turns a corruption error of a query on the store's file into a
// *storage.DamagedError. Use it as defer db.explain(&err).
func (db *AgentStore) explain(errp *error) { db.sdb.Explain(errp) }
