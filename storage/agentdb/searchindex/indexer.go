package searchindex

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/calltap/calltap/storage"
)

// The full-text index of an agent store lives in a database file of its
// own beside the store (Path), written by an indexer on a
// connection of its own. SQLite lets one connection at a time write a
// file: with the index in the store, tokenising a body (as costly as
// saving it: real events are full of ids and timestamps) took the capture
// writer's time; in a file of its own it takes another core's.
//
// WriteCaptures saves a capture and its body; the indexer reads the body
// back (the store's capture_bodies) and adds it to the index later:
//
//   - when this process has written nothing for searchIdle, a chunk of
//     Chunk at a time, so a burst is saved at full speed and indexed
//     once it is over;
//   - at once, beside the writer, while more than the backlog's bound
//     (DefaultBacklogMax) is unindexed. Past the bound the writer saves no
//     more than the indexer indexes (plus DefaultLead): WriteCaptures waits
//     for it, so a load it cannot keep up with is slowed to its pace and
//     the backlog stops growing, and a backlog the writer did not make (an
//     index being rebuilt) slows writes to the indexer's pace, never stops
//     them;
//   - before any text search, which indexes the whole backlog first, so
//     that results always include every capture saved before the search.
//
// This file is the pace: when to index. The index file's statements are
// File's (searchindex.go, write.go, query.go).

const (
	DefaultBacklogMax = 50_000                // default bound of the backlog
	DefaultLead       = 4 * Chunk             // captures the writer may save past the bound before the indexer's pace holds it
	Chunk             = 1024                  // captures per background indexing transaction
	searchIdle        = 50 * time.Millisecond // no write for this long: the writer is idle
	searchRetry       = time.Second           // after a failed chunk, the background indexer waits this long
)

// Indexer keeps an agent store's full-text index.
type Indexer struct {
	db    *sql.DB       // one connection: the store, with the index attached as "search"
	file  *File         // the index file: its statements
	store string        // the store's file
	wake  chan struct{} // a commit saved captures
	stop  chan struct{} // closed by Close
	done  chan struct{} // closed when run returns

	// mu is taken last: the store's writers take it under their own locks
	// (Touch under the intake log's, WaitRoom and Saved under an apply's),
	// and nothing is called while it is held.
	mu        sync.Mutex
	upto      int64         // guarded by mu: every capture with seq ≤ upto is indexed (or not indexable)
	last      int64         // guarded by mu: newest capture seq seen
	bound     int64         // guarded by mu: the backlog's bound
	idle      time.Duration // guarded by mu: searchIdle, or the Idle option
	lead      int64         // set at Open: DefaultLead, or the Lead option
	lastWrite time.Time     // guarded by mu: this process's latest commit of captures
	credit    int64         // guarded by mu: captures the writer may still save while past the bound
	failed    error         // guarded by mu: the background indexer's last error, nil after a success
	moved     chan struct{} // guarded by mu: closed (and replaced) when upto moves or indexing fails
}

// Open opens the index file beside the store at path, whose large bodies
// are in the folder bodies (creating or rebuilding it), and starts the
// background indexer, keeping pace. pool opens a pool on the store with the index
// attached as "search".
// An index SQLite finds damaged is deleted and made again: it is derived
// from the store. Should the second try fail the same way, the damage is
// the store's, and the error says so (the caller explains it).
func Open(ctx context.Context, pool func() *sql.DB, path, bodies string, pace Pace) (*Indexer, error) {
	ix, err := openOnce(ctx, pool, path, bodies, pace)
	if err == nil || !storage.IsCorrupt(err) {
		return ix, err
	}
	slog.Warn("storage: the search index is damaged; rebuilding it from the captures", "path", Path(path), "err", err)
	if err := Remove(path); err != nil {
		return nil, err
	}
	return openOnce(ctx, pool, path, bodies, pace)
}

func openOnce(ctx context.Context, pool func() *sql.DB, path, bodies string, pace Pace) (*Indexer, error) {
	idb := pool() // the store, with the index attached as "search"
	idb.SetMaxOpenConns(1)
	idb.SetMaxIdleConns(1)
	idb.SetConnMaxLifetime(0)
	ix := &Indexer{db: idb, file: NewFile(path, bodies), store: path, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		bound: max(pace.BacklogMax, 0), idle: pace.Idle, lead: pace.Lead, credit: pace.Lead, moved: make(chan struct{})}
	if err := ix.prepare(ctx); err != nil {
		idb.Close()
		return nil, err
	}
	go ix.run()
	ix.poke() // a backlog left by an earlier process is indexed now
	return ix, nil
}

// Damage is the index file's Damage; nil for a read-only store's.
func (ix *Indexer) Damage(err error) error {
	if ix == nil {
		return err
	}
	return ix.file.Damage(err)
}

// prepare makes the index file current and reads its position.
func (ix *Indexer) prepare(ctx context.Context) error {
	conn, err := ix.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("storage: search index: %w", err)
	}
	defer conn.Close()
	upto, last, err := ix.file.Prepare(ctx, conn)
	if err != nil {
		return err
	}
	ix.setPosition(upto, last)
	return nil
}

func (ix *Indexer) poke() {
	select {
	case ix.wake <- struct{}{}:
	default:
	}
}

// Saved tells the indexer that this process committed captures up to seq.
func (ix *Indexer) Saved(seq int64) {
	ix.mu.Lock()
	ix.last = max(ix.last, seq)
	ix.lastWrite = time.Now()
	ix.mu.Unlock()
	ix.poke()
}

// Touch tells the indexer the store is being written (the intake log took
// captures it will apply): indexing waits for the writer to be idle.
func (ix *Indexer) Touch() {
	ix.mu.Lock()
	ix.lastWrite = time.Now()
	ix.mu.Unlock()
}

// setPosition records a position read in an indexing transaction and wakes
// writers waiting for it.
func (ix *Indexer) setPosition(upto, last int64) {
	ix.mu.Lock()
	ix.credit = min(ix.credit+max(upto-ix.upto, 0), ix.lead)
	ix.upto, ix.last, ix.failed = upto, max(ix.last, last), nil
	close(ix.moved)
	ix.moved = make(chan struct{})
	ix.mu.Unlock()
}

func (ix *Indexer) fail(err error) {
	ix.mu.Lock()
	ix.failed = err
	close(ix.moved)
	ix.moved = make(chan struct{})
	ix.mu.Unlock()
}

func (ix *Indexer) Backlog() int64 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.last - ix.upto
}

// WaitRoom returns once n more captures may be saved: at once within the
// bound, else once the indexer has given the writer credit (each capture
// it indexes is one more the writer may save), or while the indexer is
// failing: a broken index must not stop captures from being saved
// (searches report its error).
func (ix *Indexer) WaitRoom(ctx context.Context, n int) error {
	for {
		ix.mu.Lock()
		within := ix.last-ix.upto <= ix.bound || ix.failed != nil
		if within || ix.credit > 0 {
			if within {
				ix.credit = ix.lead // a fresh lead, which this write starts to spend
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
func (ix *Indexer) run() {
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
func (ix *Indexer) work(idle *time.Timer) bool {
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
		if _, err := ix.Index(context.Background(), Chunk); err != nil {
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
func (ix *Indexer) sleep(idle *time.Timer, d time.Duration) bool {
	idle.Reset(d)
	select {
	case <-ix.stop:
		idle.Stop()
		return false
	case <-idle.C:
		return true
	}
}

func (ix *Indexer) Close() error {
	close(ix.stop)
	<-ix.done
	ix.fail(errors.New("storage: closed")) // writers waiting for room go on
	return ix.db.Close()
}

// RemoveIfDamaged deletes the index file once no connection of this store
// has it open any more, if SQLite found it damaged.
func (ix *Indexer) RemoveIfDamaged() error { return ix.file.RemoveIfDamaged() }

// Index adds up to max of the oldest unindexed captures to the index in
// one transaction and returns the backlog left (searchindex.File.Index).
// ctx is checked before the transaction begins; the statements run
// without it.
func (ix *Indexer) Index(ctx context.Context, max int) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tx, err := ix.db.BeginTx(context.Background(), nil)
	if err != nil {
		return 0, fmt.Errorf("storage: begin indexing: %w", err)
	}
	defer tx.Rollback()
	upto, last, err := ix.file.Index(tx, max)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, ix.Damage(fmt.Errorf("storage: commit indexing: %w", err))
	}
	ix.setPosition(upto, last)
	return last - upto, nil
}

// Pace is how the indexer keeps pace with the capture writer.
type Pace struct {
	// BacklogMax is the backlog's bound: within it the indexer waits for
	// the writer to be idle; past it, it works beside the writer, which
	// saves no more than the indexer indexes (plus Lead). 0 indexes every
	// capture as soon as it is saved.
	BacklogMax int64
	// Lead is how many captures the writer may save past the bound before
	// the indexer's pace holds it.
	Lead int64
	// Idle is how long the writer must have written nothing for the
	// indexer to take a backlog within its bound.
	Idle time.Duration
}

// DefaultPace is the pace of a store opened with no other: a bound of
// 50,000 captures, a lead of 4,096, 50 ms idle.
func DefaultPace() Pace {
	return Pace{BacklogMax: DefaultBacklogMax, Lead: DefaultLead, Idle: searchIdle}
}

// Err is the background indexer's last error, nil after a success.
func (ix *Indexer) Err() error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.failed
}

// DB is the indexer's one connection (the store, with the index attached):
// the store's deletions and vacuums of the index run on it.
func (ix *Indexer) DB() *sql.DB { return ix.db }

// File is the index file's statements. A nil Indexer (a read-only store's)
// has a nil File, whose queries run all the same.
func (ix *Indexer) File() *File {
	if ix == nil {
		return nil
	}
	return ix.file
}
