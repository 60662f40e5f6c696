package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/intake"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The full-text index of an agent store lives in a database file of its
// own beside the store (SearchIndexPath), written by an indexer on a
// connection of its own. SQLite lets one connection at a time write a
// file: with the index in the store, tokenising a body (as costly as
// saving it: real events are full of ids and timestamps) took the capture
// writer's time; in a file of its own it takes another core's.
//
// WriteCaptures saves a capture and its body; the indexer reads the body
// back (the store's capture_bodies) and adds it to the index later:
//
//   - when this process has written nothing for searchIdle, a chunk of
//     searchChunk at a time, so a burst is saved at full speed and indexed
//     once it is over;
//   - at once, beside the writer, while more than the backlog's bound
//     (searchBacklogMax) is unindexed. Past the bound the writer saves no
//     more than the indexer indexes (plus searchLead): WriteCaptures waits
//     for it, so a load it cannot keep up with is slowed to its pace and
//     the backlog stops growing, and a backlog the writer did not make (an
//     index being rebuilt) slows writes to the indexer's pace, never stops
//     them;
//   - before any text search, which indexes the whole backlog first, so
//     that results always include every capture saved before the search.
//
// The indexer's position (indexed_upto) is in the index file and is read
// inside every indexing transaction, after taking the file's write lock:
// another process may index the same store (calltap backfill beside
// calltap listen). The index is derived data: a missing file, one of an
// older format, or one recorded for another store (a copied or restored
// agent.db) is rebuilt from the bodies.

const (
	searchBacklogMax = 50_000                // default bound of the backlog
	searchLead       = 4 * searchChunk       // captures the writer may save past the bound before the indexer's pace holds it
	searchChunk      = 1024                  // captures per background indexing transaction
	searchIdle       = 50 * time.Millisecond // no write for this long: the writer is idle
	searchRetry      = time.Second           // after a failed chunk, the background indexer waits this long
	searchFormat     = 2                     // the index file's user_version; another value rebuilds it (2: entries can be deleted)
)

// SearchIndexPath is the full-text index file of the agent store at path:
// agent-search.db for agent.db. It can be deleted; it is rebuilt.
func SearchIndexPath(path string) string {
	return strings.TrimSuffix(path, ".db") + "-search.db"
}

// indexer keeps an agent store's full-text index.
type indexer struct {
	db     *sql.DB       // one connection: the store, with the index attached as "search"
	path   string        // the index file (SearchIndexPath)
	store  string        // the store's file
	bodies string        // the folder of large bodies (BodiesDir)
	wake   chan struct{} // a commit saved captures
	stop   chan struct{} // closed by close
	done   chan struct{} // closed when run returns

	mu        sync.Mutex
	upto      int64         // guarded by mu: every capture with seq ≤ upto is indexed (or not indexable)
	last      int64         // guarded by mu: newest capture seq seen
	bound     int64         // guarded by mu: the backlog's bound
	idle      time.Duration // guarded by mu: searchIdle (tests wait longer)
	lastWrite time.Time     // guarded by mu: this process's latest commit of captures
	credit    int64         // guarded by mu: captures the writer may still save while past the bound
	failed    error         // guarded by mu: the background indexer's last error, nil after a success
	moved     chan struct{} // guarded by mu: closed (and replaced) when upto moves or indexing fails

	damaged atomic.Bool // SQLite found the index damaged: close deletes it
}

// openIndexer opens the index file beside the store (creating or
// rebuilding it) and starts the background indexer. pool opens a pool on the store with the index attached as "search".
// An index SQLite finds damaged is deleted and made again: it is derived
// from the store. Should the second try fail the same way, the damage is
// the store's, and the error says so (the caller explains it).
func openIndexer(ctx context.Context, pool func() *sql.DB, path string) (*indexer, error) {
	ix, err := openIndexerOnce(ctx, pool, path)
	if err == nil || !storage.IsCorrupt(err) {
		return ix, err
	}
	slog.Warn("storage: the search index is damaged; rebuilding it from the captures", "path", SearchIndexPath(path), "err", err)
	if err := removeSearchIndex(path); err != nil {
		return nil, err
	}
	return openIndexerOnce(ctx, pool, path)
}

// removeSearchIndex deletes the index file of the store at path, with its
// WAL, shared-memory and journal files.
func removeSearchIndex(path string) error {
	var errs []error
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		if err := os.Remove(SearchIndexPath(path) + suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("storage: remove the damaged search index: %w", err)
	}
	return nil
}

func openIndexerOnce(ctx context.Context, pool func() *sql.DB, path string) (*indexer, error) {
	idb := pool() // the store, with the index attached as "search"
	idb.SetMaxOpenConns(1)
	idb.SetMaxIdleConns(1)
	idb.SetConnMaxLifetime(0)
	ix := &indexer{db: idb, path: SearchIndexPath(path), store: path, bodies: BodiesDir(path), wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		bound: searchBacklogMax, idle: searchIdle, credit: searchLead, moved: make(chan struct{})}
	if err := ix.prepare(ctx); err != nil {
		idb.Close()
		return nil, err
	}
	go ix.run()
	ix.poke() // a backlog left by an earlier process is indexed now
	return ix, nil
}

// damage turns a corruption error of a statement on the index alone into
// a *DamagedError naming the index, and marks the index for deletion when
// the store closes, so that the next Open rebuilds it.
func (ix *indexer) damage(err error) error {
	if ix == nil || err == nil || !storage.IsCorrupt(err) || errors.Is(err, storage.ErrDamaged) {
		return err
	}
	ix.damaged.Store(true)
	return &storage.DamagedError{Path: ix.path, Err: err,
		Advice: "It is derived from the captures: calltap deletes it when it stops and rebuilds it at the next start (restart calltap to search again)."}
}

// prepare makes the index file current: the right format, this store's,
// and no further along than the store (an older copy of agent.db put back
// beside a newer index). It then reads the position.
func (ix *indexer) prepare(ctx context.Context) error {
	conn, err := ix.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("storage: search index: %w", err)
	}
	defer conn.Close()
	for _, q := range []string{`PRAGMA search.journal_mode = WAL`, `PRAGMA search.synchronous = NORMAL`, `PRAGMA search.cache_size = -32768`, `PRAGMA wal_autocheckpoint = 8192`} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("storage: search index: %s: %w", q, err)
		}
	}
	upto, last, err := checkSearchIndex(ctx, conn)
	if err != nil {
		return err
	}
	if err := vacuumAtOpen(ctx, conn, ix.path); err != nil {
		return err
	}
	ix.setPosition(upto, last)
	return nil
}

// vacuumAtOpen gives the index's free pages back to the file system (and
// converts a new index to incremental auto_vacuum). That is a tidy-up: on
// a full disk, where SQLite has no room for the pages the vacuum moves, it
// is skipped with a warning, so that the agent still starts (its answer
// path copes with a full disk) and its user can read their history and
// free space; the next prune vacuums again. Any other error fails the open.
func vacuumAtOpen(ctx context.Context, conn *sql.Conn, path string) error {
	err := incrementalVacuum(ctx, conn, "search")
	if err != nil && storage.IsDiskFull(err) {
		slog.Warn("storage: the disk is full: the search index keeps its free pages until the next prune", "path", path, "err", err)
		return nil
	}
	return err
}

// checkSearchIndex reads the index's state and, when it is not this
// store's current index, makes it one, empty, in one immediate
// transaction: no other writer comes between. It returns
// the position: indexed up to upto, of captures up to last.
func checkSearchIndex(ctx context.Context, conn *sql.Conn) (upto, last int64, err error) {
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return 0, 0, fmt.Errorf("storage: search index: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			conn.ExecContext(context.Background(), `ROLLBACK`)
		}
	}()
	st, err := readSearchState(ctx, conn)
	if err != nil {
		return 0, 0, err
	}
	upto = st.upto
	if !st.current() {
		upto = 0
		if err := createSearchIndex(ctx, conn, st.store); err != nil {
			return 0, 0, err
		}
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		return 0, 0, fmt.Errorf("storage: search index: %w", err)
	}
	committed = true
	return upto, st.last, nil
}

// searchState is what the index file and the store say about the index.
type searchState struct {
	format int64  // the index file's user_version
	store  string // the store's identity
	have   string // the identity of the store the index was built for
	upto   int64  // the index's position: captures up to it are indexed
	last   int64  // the highest seq the store ever gave
}

// current reports whether the index is this store's, in this format, and
// no further along than the store.
func (st searchState) current() bool {
	return st.format == searchFormat && st.have == st.store && st.upto <= st.last
}

// readSearchState reads the index's format, identity and position, and
// the store's identity and last seq; an index in another format has no
// identity or position to read.
func readSearchState(ctx context.Context, conn *sql.Conn) (st searchState, err error) {
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
	if st.format != searchFormat {
		return st, nil
	}
	err = conn.QueryRowContext(ctx, `SELECT store, indexed_upto FROM search.search_progress WHERE id = 1`).Scan(&st.have, &st.upto)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return st, fmt.Errorf("storage: search progress: %w", err)
	}
	return st, nil
}

// createSearchIndex drops the index's tables and creates them empty, for
// the store whose identity is store, at position 0.
func createSearchIndex(ctx context.Context, conn *sql.Conn, store string) error {
	for _, q := range []string{
		`DROP TABLE IF EXISTS search.captures_fts`,
		`DROP TABLE IF EXISTS search.search_progress`,
		`DROP TABLE IF EXISTS search.search_forget`,
		// An FTS4 table without content ("contentless") cannot delete
		// an entry; one with external content can, reading the text to
		// remove from its content table. search_forget is that table,
		// empty but while a deletion puts there the bodies it removes
		// (see deleteBatch): the text is in the store, not twice here.
		`CREATE TABLE search.search_forget (docid INTEGER PRIMARY KEY, body TEXT)`,
		`CREATE VIRTUAL TABLE search.captures_fts USING fts4 (content="search_forget", body, tokenize=unicode61)`,
		`CREATE TABLE search.search_progress (id INTEGER PRIMARY KEY CHECK (id = 1), store TEXT NOT NULL, indexed_upto INTEGER NOT NULL)`,
		fmt.Sprintf(`PRAGMA search.user_version = %d`, searchFormat),
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

func (ix *indexer) poke() {
	select {
	case ix.wake <- struct{}{}:
	default:
	}
}

// saved tells the indexer that this process committed captures up to seq.
func (ix *indexer) saved(seq int64) {
	ix.mu.Lock()
	ix.last = max(ix.last, seq)
	ix.lastWrite = time.Now()
	ix.mu.Unlock()
	ix.poke()
}

// touch tells the indexer the store is being written (the intake log took
// captures it will apply): indexing waits for the writer to be idle.
func (ix *indexer) touch() {
	ix.mu.Lock()
	ix.lastWrite = time.Now()
	ix.mu.Unlock()
}

// setPosition records a position read in an indexing transaction and wakes
// writers waiting for it.
func (ix *indexer) setPosition(upto, last int64) {
	ix.mu.Lock()
	ix.credit = min(ix.credit+max(upto-ix.upto, 0), searchLead)
	ix.upto, ix.last, ix.failed = upto, max(ix.last, last), nil
	close(ix.moved)
	ix.moved = make(chan struct{})
	ix.mu.Unlock()
}

func (ix *indexer) fail(err error) {
	ix.mu.Lock()
	ix.failed = err
	close(ix.moved)
	ix.moved = make(chan struct{})
	ix.mu.Unlock()
}

func (ix *indexer) backlog() int64 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.last - ix.upto
}

// waitRoom returns once n more captures may be saved: at once within the
// bound, else once the indexer has given the writer credit (each capture
// it indexes is one more the writer may save), or while the indexer is
// failing: a broken index must not stop captures from being saved
// (searches report its error).
func (ix *indexer) waitRoom(ctx context.Context, n int) error {
	for {
		ix.mu.Lock()
		within := ix.last-ix.upto <= ix.bound || ix.failed != nil
		if within || ix.credit > 0 {
			if within {
				ix.credit = searchLead // a fresh lead, which this write starts to spend
			}
			ix.credit -= int64(n)
			ix.mu.Unlock()
			return nil
		}
		moved := ix.moved
		ix.mu.Unlock()
		ix.poke()
		select {
		case <-moved:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run is the background indexer; see the comment at the top of the file.
func (ix *indexer) run() {
	defer close(ix.done)
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	for {
		select {
		case <-ix.stop:
			return
		case <-ix.wake:
		}
		if !ix.work(idle) {
			return
		}
	}
}

// work indexes the backlog, a chunk at a time, while the writer is idle or
// the backlog is over its bound. It reports false when the store is
// closing: that does not wait for the backlog, which may be minutes of
// large bodies; the next start indexes it.
func (ix *indexer) work(idle *time.Timer) bool {
	for {
		ix.mu.Lock()
		backlog, bound, wait := ix.last-ix.upto, ix.bound, ix.idle-time.Since(ix.lastWrite)
		ix.mu.Unlock()
		if backlog <= 0 {
			return true
		}
		if backlog <= bound && wait > 0 {
			if !ix.sleep(idle, wait) {
				return false
			}
			continue
		}
		select {
		case <-ix.stop:
			return false
		default:
		}
		if _, err := ix.index(context.Background(), searchChunk); err != nil {
			if storage.IsCorrupt(err) && !errors.Is(err, storage.ErrDamaged) { // not the index's: the store's
				err = &storage.DamagedError{Path: ix.store, Advice: storage.RecoverAdvice(ix.store), Err: err}
			}
			// Tried again after the next commit, but not at once: a
			// failure that lasts (a full disk) is not retried, and
			// logged, at the pace of requests. A search reports it.
			ix.fail(err)
			slog.Warn("storage: indexing captures for search", "err", err)
			return ix.sleep(idle, searchRetry)
		}
	}
}

// sleep waits d on idle; it reports false if the store closes meanwhile.
func (ix *indexer) sleep(idle *time.Timer, d time.Duration) bool {
	idle.Reset(d)
	select {
	case <-ix.stop:
		idle.Stop()
		return false
	case <-idle.C:
		return true
	}
}

func (ix *indexer) close() error {
	close(ix.stop)
	<-ix.done
	ix.fail(errors.New("storage: closed")) // writers waiting for room go on
	return ix.db.Close()
}

// removeIfDamaged deletes the index file once no connection of this store
// has it open any more, if SQLite found it damaged.
func (ix *indexer) removeIfDamaged(storePath string) error {
	if !ix.damaged.Load() {
		return nil
	}
	slog.Warn("storage: deleting the damaged search index; the next start rebuilds it", "path", ix.path)
	return removeSearchIndex(storePath)
}

const (
	// qLastSeq reads the highest seq ever given to a capture: seqs are
	// never reused, and the newest captures may have been deleted.
	qLastSeq = `SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'captures'), 0), coalesce((SELECT max(seq) FROM captures), 0))`
	// A body kept in a segment comes back as NULL with where it is: the
	// indexer reads it from there if it is small enough to index.
	qBodiesAfter = `SELECT b.seq, b.file, b.file_offset, c.size, CASE WHEN b.file IS NULL AND length(b.body) <= ` + maxIndexedBodyText + ` THEN b.body END
		FROM capture_bodies b JOIN captures c ON c.seq = b.seq WHERE b.seq > ? ORDER BY b.seq LIMIT ?`
	qFtsIns = `INSERT INTO search.captures_fts (docid, body) VALUES (?, ?)`
)

// index adds up to max of the oldest unindexed captures to the index in
// one transaction and returns the backlog left. Bodies are read one at a
// time: a chunk of 1 MiB bodies is never held at once.
//
// When no body is left to read below the newest capture (a capture
// without a body row), the position moves to it all the same, so that a
// backlog always ends.
//
// Statements run with context.Background() (no watcher goroutine per
// statement); ctx is checked before the transaction begins.
func (ix *indexer) index(ctx context.Context, max int) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	bg := context.Background()
	tx, err := ix.db.BeginTx(bg, nil)
	if err != nil {
		return 0, fmt.Errorf("storage: begin indexing: %w", err)
	}
	defer tx.Rollback()
	// The index's write lock first (BEGIN is deferred on this connection,
	// which writes only the index): the position read next is then the
	// latest, whoever indexed last.
	if _, err := tx.ExecContext(bg, `UPDATE search.search_progress SET indexed_upto = indexed_upto WHERE id = 1`); err != nil {
		return 0, ix.damage(fmt.Errorf("storage: lock the search index: %w", err))
	}
	var upto, last int64
	if err := tx.QueryRowContext(bg, `SELECT indexed_upto FROM search.search_progress WHERE id = 1`).Scan(&upto); err != nil {
		return 0, ix.damage(fmt.Errorf("storage: read search progress: %w", err))
	}
	// The highest seq ever given, as prepare reads it: a deleted newest
	// capture leaves no row, and a position short of its seq would leave a
	// backlog that never ends.
	if err := tx.QueryRowContext(bg, qLastSeq).Scan(&last); err != nil {
		return 0, fmt.Errorf("storage: newest capture: %w", err)
	}
	if upto < last {
		if upto, err = ix.indexBodies(tx, upto, last, max); err != nil {
			return 0, err
		}
		if _, err := tx.ExecContext(bg, `UPDATE search.search_progress SET indexed_upto = ? WHERE id = 1`, upto); err != nil {
			return 0, ix.damage(fmt.Errorf("storage: save search progress: %w", err))
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, ix.damage(fmt.Errorf("storage: commit indexing: %w", err))
	}
	ix.setPosition(upto, last)
	return last - upto, nil
}

func (ix *indexer) indexBodies(tx *sql.Tx, upto, last int64, max int) (int64, error) {
	bg := context.Background()
	ins, err := tx.PrepareContext(bg, qFtsIns)
	if err != nil {
		return upto, fmt.Errorf("storage: index capture body: %w", err)
	}
	defer ins.Close()
	rows, err := tx.QueryContext(bg, qBodiesAfter, upto, max)
	if err != nil {
		return upto, fmt.Errorf("storage: read bodies to index: %w", err)
	}
	defer rows.Close()
	var bodies intake.SegmentReader // consecutive bodies mostly share a file (the intake log's)
	defer bodies.Close()
	read := 0
	for rows.Next() {
		var seq, size int64
		var file sql.NullString
		var offset sql.NullInt64
		var body sql.RawBytes // valid until the next row: not copied
		if err := rows.Scan(&seq, &file, &offset, &size, &body); err != nil {
			return upto, fmt.Errorf("storage: read bodies to index: %w", err)
		}
		if file.Valid && size <= maxIndexedBody {
			b, err := bodies.Read(ix.bodies, file.String, offset.Int64, size)
			if err != nil {
				return upto, err
			}
			body = b
		}
		if indexable(body) {
			if _, err := ins.ExecContext(bg, seq, string(body)); err != nil {
				return upto, ix.damage(fmt.Errorf("storage: index capture body: %w", err))
			}
		}
		upto = seq
		read++
	}
	if err := rows.Err(); err != nil {
		return upto, fmt.Errorf("storage: read bodies to index: %w", err)
	}
	if read < max {
		upto = last // nothing more to read up to the newest capture
	}
	return upto, nil
}

// SetSearchBacklogMax sets the bound of the backlog (default 50,000); 0
// indexes every capture as soon as it is saved, beside the writer.
func (db *AgentStore) SetSearchBacklogMax(n int64) {
	if db.index == nil {
		return
	}
	db.index.mu.Lock()
	db.index.bound = max(n, 0)
	db.index.mu.Unlock()
	db.index.poke()
}

// SearchBacklog is how many saved captures the full-text index had not
// taken as this process last saw; searches do not rely on it.
func (db *AgentStore) SearchBacklog() int64 {
	if db.index == nil {
		return 0
	}
	return db.index.backlog()
}

// IndexSearch adds up to max of the oldest unindexed captures to the
// full-text index in one transaction and returns the backlog left.
func (db *AgentStore) IndexSearch(ctx context.Context, max int) (_ int64, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return 0, err
	}
	if db.index == nil {
		return 0, fmt.Errorf("storage: %s databases have no search index", Schema)
	}
	return db.index.index(ctx, max)
}

// CatchUpSearch indexes the whole backlog, so a search sees every capture;
// every text search does it first. The backlog is read from the files, not
// this process's view: another process may have saved captures.
func (db *AgentStore) CatchUpSearch(ctx context.Context) (err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return err
	}
	if db.reader != nil {
		return db.readerSearch(ctx)
	}
	// One query per file, so that damage found is put down to the right one.
	var last, upto int64
	if err := db.read.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM captures`).Scan(&last); err != nil {
		return fmt.Errorf("storage: search backlog: %w", err)
	}
	if err := db.read.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress WHERE id = 1`).Scan(&upto); err != nil {
		return db.index.damage(fmt.Errorf("storage: search backlog: %w", err))
	}
	for backlog := last - upto; backlog > 0; {
		if backlog, err = db.IndexSearch(ctx, 2048); err != nil {
			return err
		}
	}
	return nil
}
