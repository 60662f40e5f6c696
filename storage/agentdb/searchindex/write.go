package searchindex

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/calltap/calltap/storage/intake"
)

const (
	// qLastSeq reads the highest seq ever given to a capture: seqs are
	// never reused, and the newest captures may have been deleted.
	qLastSeq = `SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'captures'), 0), coalesce((SELECT max(seq) FROM captures), 0))`
	// A body kept in a segment comes back as NULL with where it is: it is
	// read from there if it is small enough to index.
	qBodiesAfter = `SELECT b.seq, b.file, b.file_offset, c.size, CASE WHEN b.file IS NULL AND length(b.body) <= ` + MaxBodyText + ` THEN b.body END
		FROM capture_bodies b JOIN captures c ON c.seq = b.seq WHERE b.seq > ? ORDER BY b.seq LIMIT ?`
	qFtsIns = `INSERT INTO search.captures_fts (docid, body) VALUES (?, ?)`
)

// LockProgress takes the index's write lock in tx (a no-op update of its
// progress row), as every writer of the index takes it first, and returns
// the position read under it: the captures up to upto have entries.
func (f *File) LockProgress(ctx context.Context, tx *sql.Tx) (upto int64, err error) {
	if _, err := tx.ExecContext(ctx, `UPDATE search.search_progress SET indexed_upto = indexed_upto WHERE id = 1`); err != nil {
		return 0, f.Damage(fmt.Errorf("storage: lock the search index: %w", err))
	}
	if err := tx.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress WHERE id = 1`).Scan(&upto); err != nil {
		return 0, f.Damage(fmt.Errorf("storage: read search progress: %w", err))
	}
	return upto, nil
}

// Index adds up to max of the oldest unindexed captures to the index in
// tx, the caller's, which commits it; it returns the new position, indexed
// up to upto of captures up to last. Bodies are read one at a time: a chunk
// of 1 MiB bodies is never held at once.
//
// When no body is left to read below the newest capture (a capture without
// a body row), the position moves to it all the same, so that a backlog
// always ends. Statements run with context.Background() (no watcher
// goroutine per statement).
func (f *File) Index(tx *sql.Tx, max int) (upto, last int64, err error) {
	bg := context.Background()
	// The write lock first (BEGIN is deferred on the indexer's connection,
	// which writes only the index): the position read next is then the
	// latest, whoever indexed last.
	if upto, err = f.LockProgress(bg, tx); err != nil {
		return 0, 0, err
	}
	// The highest seq ever given, as Prepare reads it: a deleted newest
	// capture leaves no row, and a position short of its seq would leave a
	// backlog that never ends.
	if err := tx.QueryRowContext(bg, qLastSeq).Scan(&last); err != nil {
		return 0, 0, fmt.Errorf("storage: newest capture: %w", err)
	}
	if upto >= last {
		return upto, last, nil
	}
	if upto, err = f.indexBodies(tx, upto, last, max); err != nil {
		return 0, 0, err
	}
	if _, err := tx.ExecContext(bg, `UPDATE search.search_progress SET indexed_upto = ? WHERE id = 1`, upto); err != nil {
		return 0, 0, f.Damage(fmt.Errorf("storage: save search progress: %w", err))
	}
	return upto, last, nil
}

func (f *File) indexBodies(tx *sql.Tx, upto, last int64, max int) (int64, error) {
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
		if file.Valid && size <= MaxBody {
			b, err := bodies.Read(f.bodies, file.String, offset.Int64, size)
			if err != nil {
				return upto, err
			}
			body = b
		}
		if Indexable(body) {
			if _, err := ins.ExecContext(bg, seq, string(body)); err != nil {
				return upto, f.Damage(fmt.Errorf("storage: index capture body: %w", err))
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

// Entry is the index entry of a deleted capture: its seq and the text that
// was indexed (nil for none).
type Entry struct {
	Seq  int64
	Text []byte
}

// Forget removes the entries of deleted captures that were indexed (seq up
// to upto, the position LockProgress read in tx), through search_forget:
// FTS4 removes an entry only given its text.
func (f *File) Forget(ctx context.Context, tx *sql.Tx, gone []Entry, upto int64) error {
	for _, e := range gone {
		if e.Seq > upto || e.Text == nil {
			continue // never indexed
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO search.search_forget (docid, body) VALUES (?, ?)`, e.Seq, string(e.Text)); err != nil {
			return f.Damage(fmt.Errorf("storage: forget a search entry: %w", err))
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM search.captures_fts WHERE docid = ?`, e.Seq); err != nil {
			return f.Damage(fmt.Errorf("storage: delete a search entry: %w", err))
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM search.search_forget`); err != nil {
		return f.Damage(fmt.Errorf("storage: forget search entries: %w", err))
	}
	return nil
}

// Progress reads the index's position on db (a pool with the index
// attached).
func (f *File) Progress(ctx context.Context, db *sql.DB) (upto int64, err error) {
	if err := db.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress WHERE id = 1`).Scan(&upto); err != nil {
		return 0, f.Damage(fmt.Errorf("storage: search backlog: %w", err))
	}
	return upto, nil
}
