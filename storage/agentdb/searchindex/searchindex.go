// Package searchindex is the full-text index of an agent store: a SQLite
// file of its own beside the store (Path), attached to the store's
// connections as "search". It holds the index's schema and every statement
// on it: making the file current (or rebuilding it), adding bodies,
// forgetting the entries of deleted captures, and the queries of a text
// search. When to index, the pace kept with the capture writer, is the
// store's (storage/agentdb's indexer), which calls these on a connection of
// its own.
//
// The index is derived data: a missing file, one of an older format, or one
// recorded for another store (a copied or restored agent.db) is rebuilt
// from the bodies. Its position (search_progress.indexed_upto) is in the
// file and is read inside every transaction that writes it, after taking
// the file's write lock: another process may index the same store
// (calltap backfill beside calltap listen).
//
// Tables, in the attached schema "search":
//
//	captures_fts     FTS4 (body), docid = the capture's seq; external
//	                 content search_forget, so that an entry can be deleted
//	search_forget    (docid, body): empty but while a deletion puts there the
//	                 bodies whose entries it removes
//	search_progress  one row: the store it was built for (its identity) and
//	                 indexed_upto, every capture up to which is indexed
//	user_version     Format
package searchindex

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/calltap/calltap/storage"
)

const (
	// Format is the index file's user_version; another value rebuilds it
	// (2: entries can be deleted).
	Format = 2
	// MaxBody keeps huge bodies out of the index.
	MaxBody     = 1 << 20
	MaxBodyText = "1048576" // MaxBody, in SQL
)

// Path is the index file of the agent store at store: agent-search.db for
// agent.db. It can be deleted; it is rebuilt.
func Path(store string) string {
	return strings.TrimSuffix(store, ".db") + "-search.db"
}

// Indexable reports whether a body goes into the index: UTF-8 text of at
// most MaxBody bytes.
func Indexable(body []byte) bool {
	return len(body) > 0 && len(body) <= MaxBody && utf8.Valid(body)
}

// Remove deletes the index file of the store at store, with its WAL,
// shared-memory and journal files.
func Remove(store string) error {
	var errs []error
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		if err := os.Remove(Path(store) + suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("storage: remove the damaged search index: %w", err)
	}
	return nil
}

// File is the index file of one open store. It remembers whether SQLite
// found the file damaged, so that the store deletes it once closed.
type File struct {
	store   string      // the store's file
	bodies  string      // the folder of the store's large bodies
	damaged atomic.Bool // set by Damage; read by RemoveIfDamaged
}

// NewFile is the index file of the store at store, whose large bodies are
// in the folder bodies.
func NewFile(store, bodies string) *File { return &File{store: store, bodies: bodies} }

// Damage turns a corruption error of a statement on the index alone into
// a *storage.DamagedError naming the index, and marks the index for
// deletion when the store closes, so that the next open rebuilds it.
func (f *File) Damage(err error) error {
	if f == nil || err == nil || !storage.IsCorrupt(err) || errors.Is(err, storage.ErrDamaged) {
		return err
	}
	f.damaged.Store(true)
	return &storage.DamagedError{Path: Path(f.store), Err: err,
		Advice: "It is derived from the captures: calltap deletes it when it stops and rebuilds it at the next start (restart calltap to search again)."}
}

// RemoveIfDamaged deletes the index file, if SQLite found it damaged; the
// caller has closed every connection that had it open.
func (f *File) RemoveIfDamaged() error {
	if !f.damaged.Load() {
		return nil
	}
	slog.Warn("storage: deleting the damaged search index; the next start rebuilds it", "path", Path(f.store))
	return Remove(f.store)
}

// Prepare makes the index file current on conn (the store, with the index
// attached): the right format, this store's, and no further along than
// the store (an older copy of agent.db put back beside a newer index). It
// returns the position: indexed up to upto, of captures up to last.
func (f *File) Prepare(ctx context.Context, conn *sql.Conn) (upto, last int64, err error) {
	for _, q := range []string{`PRAGMA search.journal_mode = WAL`, `PRAGMA search.synchronous = NORMAL`, `PRAGMA search.cache_size = -32768`, `PRAGMA wal_autocheckpoint = 8192`} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return 0, 0, fmt.Errorf("storage: search index: %s: %w", q, err)
		}
	}
	if upto, last, err = checkIndex(ctx, conn); err != nil {
		return 0, 0, err
	}
	if err := vacuumAtOpen(ctx, conn, Path(f.store)); err != nil {
		return 0, 0, err
	}
	return upto, last, nil
}

// vacuumAtOpen gives the index's free pages back to the file system (and
// converts a new index to incremental auto_vacuum). That is a tidy-up: on
// a full disk, where SQLite has no room for the pages the vacuum moves, it
// is skipped with a warning, so that the agent still starts (its answer
// path copes with a full disk) and its user can read their history and
// free space; the next prune vacuums again. Any other error fails the open.
func vacuumAtOpen(ctx context.Context, conn *sql.Conn, path string) error {
	err := storage.IncrementalVacuum(ctx, conn, "search")
	if err != nil && storage.IsDiskFull(err) {
		slog.Warn("storage: the disk is full: the search index keeps its free pages until the next prune", "path", path, "err", err)
		return nil
	}
	return err
}

// checkIndex reads the index's state and, when it is not this store's
// current index, makes it one, empty, in one immediate transaction: no
// other writer comes between. It returns the position: indexed up to
// upto, of captures up to last.
func checkIndex(ctx context.Context, conn *sql.Conn) (upto, last int64, err error) {
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return 0, 0, fmt.Errorf("storage: search index: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			conn.ExecContext(context.Background(), `ROLLBACK`)
		}
	}()
	st, err := readState(ctx, conn)
	if err != nil {
		return 0, 0, err
	}
	upto = st.upto
	if !st.current() {
		upto = 0
		if err := create(ctx, conn, st.store); err != nil {
			return 0, 0, err
		}
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		return 0, 0, fmt.Errorf("storage: search index: %w", err)
	}
	committed = true
	return upto, st.last, nil
}

// state is what the index file and the store say about the index.
type state struct {
	format int64  // the index file's user_version
	store  string // the store's identity
	have   string // the identity of the store the index was built for
	upto   int64  // the index's position: captures up to it are indexed
	last   int64  // the highest seq the store ever gave
}

// current reports whether the index is this store's, in this format, and
// no further along than the store.
func (st state) current() bool {
	return st.format == Format && st.have == st.store && st.upto <= st.last
}

// readState reads the index's format, identity and position, and the
// store's identity and last seq; an index in another format has no
// identity or position to read.
func readState(ctx context.Context, conn *sql.Conn) (st state, err error) {
	if err := conn.QueryRowContext(ctx, `PRAGMA search.user_version`).Scan(&st.format); err != nil {
		return st, fmt.Errorf("storage: search index: %w", err)
	}
	if err := conn.QueryRowContext(ctx, `SELECT uuid FROM store_identity WHERE id = 1`).Scan(&st.store); err != nil {
		return st, fmt.Errorf("storage: store identity: %w", err)
	}
	// The highest seq ever given, not the newest capture's: the newest
	// captures may have been deleted, and seqs are never reused.
	if err := conn.QueryRowContext(ctx, qLastSeq).Scan(&st.last); err != nil {
		return st, fmt.Errorf("storage: newest capture: %w", err)
	}
	if st.format != Format {
		return st, nil
	}
	err = conn.QueryRowContext(ctx, `SELECT store, indexed_upto FROM search.search_progress WHERE id = 1`).Scan(&st.have, &st.upto)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return st, fmt.Errorf("storage: search progress: %w", err)
	}
	return st, nil
}

// create drops the index's tables and creates them empty, for the store
// whose identity is store, at position 0.
func create(ctx context.Context, conn *sql.Conn, store string) error {
	for _, q := range []string{
		`DROP TABLE IF EXISTS search.captures_fts`,
		`DROP TABLE IF EXISTS search.search_progress`,
		`DROP TABLE IF EXISTS search.search_forget`,
		// An FTS4 table without content ("contentless") cannot delete
		// an entry; one with external content can, reading the text to
		// remove from its content table. search_forget is that table,
		// empty but while a deletion puts there the bodies it removes
		// (see Forget): the text is in the store, not twice here.
		`CREATE TABLE search.search_forget (docid INTEGER PRIMARY KEY, body TEXT)`,
		`CREATE VIRTUAL TABLE search.captures_fts USING fts4 (content="search_forget", body, tokenize=unicode61)`,
		`CREATE TABLE search.search_progress (id INTEGER PRIMARY KEY CHECK (id = 1), store TEXT NOT NULL, indexed_upto INTEGER NOT NULL)`,
		fmt.Sprintf(`PRAGMA search.user_version = %d`, Format),
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("storage: create the search index: %w", err)
		}
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO search.search_progress (id, store, indexed_upto) VALUES (1, ?, 0)`, store); err != nil {
		return fmt.Errorf("storage: create the search index: %w", err)
	}
	return nil
}
