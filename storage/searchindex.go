package storage

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
)

// The full-text index is kept off the commit path. WriteCaptures saves a
// capture and its body; the index (captures_fts) takes them later, in
// batches: when the agent's writer is idle (IndexSearch), and before any
// text search runs (so a search always sees every capture saved before
// it). Tokenising a body costs as much as saving it — about half of a
// commit with real event bodies, full of ids and timestamps — so a burst
// of requests is saved at twice the rate and indexed once it is over.
//
// The backlog is bounded: beyond searchBacklogMax unindexed captures,
// each commit also indexes as many of the oldest as it saves, so a
// sustained load pays for its index as it goes and the first search after
// a long burst has at most that many to catch up on.

// searchBacklogMax is the default bound of the backlog.
const searchBacklogMax = 50_000

// searchState is what this process last saw of the indexer's position.
// The position itself is in the database (search_progress, and the newest
// capture): another process may write the same store (calltap backfill
// beside calltap listen), so every write transaction reads it again, and
// this copy only tells the agent's idle writer whether to index.
type searchState struct {
	mu   sync.Mutex
	upto int64 // guarded by mu: every capture with seq ≤ upto has been indexed (or is not indexable)
	last int64 // guarded by mu: newest capture seq
	max  int64 // guarded by mu: the backlog's bound
}

func (s *searchState) bound() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max
}

func (s *searchState) backlog() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last - s.upto
}

func (s *searchState) set(upto, last int64) {
	s.mu.Lock()
	s.upto, s.last = upto, last
	s.mu.Unlock()
}

// load reads the position inside w's transaction.
func (s *searchState) load(w *rawConn) (upto, last int64, err error) {
	if _, err := w.queryRow(`SELECT indexed_upto FROM search_progress WHERE id = 1`, nil, &upto); err != nil {
		return 0, 0, fmt.Errorf("storage: read search progress: %w", err)
	}
	if _, err := w.queryRow(`SELECT coalesce(max(seq), 0) FROM captures`, nil, &last); err != nil {
		return 0, 0, fmt.Errorf("storage: newest capture: %w", err)
	}
	return upto, last, nil
}

// SetSearchBacklogMax sets the bound of the backlog (default 50,000); 0
// indexes every capture in the commit that saves it.
func (db *DB) SetSearchBacklogMax(n int64) {
	db.search.mu.Lock()
	db.search.max = max(n, 0)
	db.search.mu.Unlock()
}

// SearchBacklog is how many saved captures the full-text index had not
// taken as of this process's last write (0 before its first); searches do
// not rely on it.
func (db *DB) SearchBacklog() int64 {
	return db.search.backlog()
}

// IndexSearch adds up to max of the oldest unindexed captures to the
// full-text index in one transaction and returns the backlog left.
func (db *DB) IndexSearch(ctx context.Context, max int) (int64, error) {
	var upto, last int64
	err := db.writeRaw(ctx, func(w *rawConn) error {
		var err error
		if upto, last, err = db.search.load(w); err != nil {
			return err
		}
		if upto >= last {
			return nil
		}
		upto, err = w.indexBodies(upto, last, max)
		return err
	})
	if err != nil {
		return 0, err
	}
	db.search.set(upto, last)
	return last - upto, nil
}

// catchUpSearch indexes the whole backlog, so a search sees every capture.
func (db *DB) catchUpSearch(ctx context.Context) error {
	var backlog int64
	err := db.read.QueryRowContext(ctx, `SELECT coalesce((SELECT max(seq) FROM captures), 0) -
		(SELECT indexed_upto FROM search_progress WHERE id = 1)`).Scan(&backlog)
	if err != nil {
		return fmt.Errorf("storage: search backlog: %w", err)
	}
	for backlog > 0 {
		if backlog, err = db.IndexSearch(ctx, 2048); err != nil {
			return err
		}
	}
	return nil
}

const (
	qBodiesAfter = `SELECT seq, CASE WHEN length(body) <= ` + maxIndexedBodyText + ` THEN body END
		FROM capture_bodies WHERE seq > ? ORDER BY seq LIMIT ?`
	qSearchUpto = `UPDATE search_progress SET indexed_upto = ? WHERE id = 1`
)

// indexBodies indexes up to max captures after upto, inside the caller's
// transaction, and returns the new position. Bodies are read one at a
// time: a batch of 1 MiB bodies is never held at once.
//
// last is the newest capture: when no body is left to read below it (a
// capture without a body row), the position moves to it all the same, so
// that a backlog always ends.
func (w *rawConn) indexBodies(upto, last int64, max int) (int64, error) {
	st, err := w.stmt(qBodiesAfter)
	if err != nil {
		return upto, err
	}
	rows, err := st.(driver.StmtQueryContext).QueryContext(context.Background(),
		[]driver.NamedValue{{Ordinal: 1, Value: upto}, {Ordinal: 2, Value: int64(max)}})
	if err != nil {
		return upto, fmt.Errorf("storage: read bodies to index: %w", err)
	}
	defer rows.Close()
	vals := make([]driver.Value, 2)
	read := 0
	for {
		if err := rows.Next(vals); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return upto, fmt.Errorf("storage: read bodies to index: %w", err)
		}
		seq, _ := vals[0].(int64)
		if body, _ := vals[1].([]byte); indexable(body) {
			if _, err := w.exec(qFtsIns, seq, string(body)); err != nil {
				return upto, fmt.Errorf("storage: index capture body: %w", err)
			}
		}
		upto = seq
		read++
	}
	if read < max {
		upto = last // nothing more to read up to the newest capture
	}
	if _, err := w.exec(qSearchUpto, upto); err != nil {
		return upto, fmt.Errorf("storage: save search progress: %w", err)
	}
	return upto, nil
}
