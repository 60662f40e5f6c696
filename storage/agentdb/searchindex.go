package agentdb

import (
	"context"
	"fmt"
)

// SearchBacklog is how many saved captures the full-text index had not
// taken as this process last saw; searches do not rely on it.
func (db *AgentStore) SearchBacklog() int64 {
	if db.index == nil {
		return 0
	}
	return db.index.Backlog()
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
	return db.index.Index(ctx, max)
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
	if upto, err = db.index.File().Progress(ctx, db.read); err != nil {
		return err
	}
	for backlog := last - upto; backlog > 0; {
		if backlog, err = db.IndexSearch(ctx, 2048); err != nil {
			return err
		}
	}
	return nil
}
