package agentdb

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// WAL checkpoints of an agent database run off the commit path: the write
// connection has wal_autocheckpoint off, and a checkpointer on a connection
// of its own copies the WAL into the database (and syncs both) while the
// writer goes on committing. A checkpoint that runs beside the writer can
// never catch up with it, and SQLite only starts the WAL over once a
// checkpoint has caught up, so the WAL is bounded by the writer itself:
// once the WAL holds more than walBound, the writer checkpoints after its
// next commit (little is left to copy by then) and the WAL starts over at
// the following one; journal_size_limit then gives the file's space back.

const (
	checkpointEvery = 100 * time.Millisecond // at most one background checkpoint per interval
	walBound        = 64 << 20               // bytes of WAL before the writer checkpoints itself
	walKeep         = walBound               // journal_size_limit: the WAL file kept after it starts over (a smaller file is grown again, zeroing fresh pages, at every cycle)
)

type checkpointer struct {
	db       *sql.DB // one connection of its own
	kick     chan struct{}
	stop     chan struct{}
	done     sync.WaitGroup
	pageSize int64
	needSync atomic.Bool // the WAL passed walBound: the writer checkpoints
}

// startCheckpointer starts checkpointing with cdb, a pool of its own
// (closed if it fails).
func startCheckpointer(ctx context.Context, cdb *sql.DB) (*checkpointer, error) {
	cdb.SetMaxOpenConns(1)
	cdb.SetMaxIdleConns(1)
	cdb.SetConnMaxLifetime(0)
	c := &checkpointer{db: cdb, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	if err := cdb.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&c.pageSize); err != nil {
		cdb.Close()
		return nil, fmt.Errorf("storage: checkpoint connection: %w", err)
	}
	c.done.Add(1)
	go c.loop()
	return c, nil
}

// committed tells the checkpointer that the WAL grew.
func (c *checkpointer) committed() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *checkpointer) loop() {
	defer c.done.Done()
	last := time.Time{}
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		}
		if wait := checkpointEvery - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-c.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		if err := c.checkpoint(); err != nil {
			slog.Warn("storage: background checkpoint", "err", err)
		}
	}
}

// checkpoint copies what it can of the WAL into the database without
// waiting for anyone.
func (c *checkpointer) checkpoint() error {
	var busy, frames, done int64
	// context.Background(): no watcher goroutine; a passive checkpoint
	// does not wait.
	if err := c.db.QueryRowContext(context.Background(), `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &done); err != nil {
		return err
	}
	if frames*c.pageSize > walBound {
		c.needSync.Store(true)
	}
	return nil
}

func (c *checkpointer) close() error {
	close(c.stop)
	c.done.Wait()
	return c.db.Close()
}
