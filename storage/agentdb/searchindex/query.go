package searchindex

import (
	"context"
	"database/sql"
	"fmt"
)

// Count is how many captures' bodies match the FTS query q, read on db (a
// pool with the index attached).
func (f *File) Count(ctx context.Context, db *sql.DB, q string) (int, error) {
	var count int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM search.captures_fts WHERE body MATCH ?`, q).Scan(&count); err != nil {
		return 0, f.Damage(fmt.Errorf("storage: count search matches: %w", err))
	}
	return count, nil
}

// Seqs returns the seqs of the captures whose body matches the FTS query
// q, in order ("ASC" or "DESC"), a page of limit after offset.
func (f *File) Seqs(ctx context.Context, db *sql.DB, q, order string, limit, offset int) (_ []int64, err error) {
	defer func() { err = f.Damage(err) }() // these statements read the index alone
	if order != "ASC" && order != "DESC" {
		return nil, fmt.Errorf("storage: search order %q", order)
	}
	rows, err := db.QueryContext(ctx, `SELECT docid FROM search.captures_fts WHERE body MATCH ? ORDER BY docid `+order+` LIMIT ? OFFSET ?`,
		q, limit, offset)
	if err != nil {
		return nil, fmt.Errorf("storage: search: %w", err)
	}
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("storage: search: %w", err)
		}
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("storage: search: %w", err)
	}
	return seqs, nil
}
