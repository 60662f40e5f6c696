package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/intake"
)

// Retention is how much history an agent store keeps. The pruner is the
// store's: it knows what is oldest and what frees space; the agent only
// runs it (RunRetention) beside the answer path.
type Retention struct {
	MaxAge   time.Duration // captures older than this go; 0: no limit
	MaxBytes int64         // the store's files (database, index, bodies, media) are brought under this; 0: no limit
	// PruneKept also prunes captures marked to keep and imported fixtures,
	// which retention otherwise never touches.
	PruneKept bool
	// Pause between two batches: the capture writer and the indexer get
	// the locks between them. Default 5 ms.
	Pause time.Duration
}

// prunable is the condition on captures c that retention may remove.
func (r Retention) prunable() string { return removable(r.PruneKept) }

// Prune removes, oldest first and a batch at a time, the captures r does
// not keep: older than MaxAge, then as many more as bring the store under
// MaxBytes. Between batches it pauses; then it hands the freed database
// pages back to the file system.
func (db *AgentStore) Prune(ctx context.Context, r Retention, now time.Time) (Deleted, error) {
	if err := db.caughtUp(ctx); err != nil {
		return Deleted{}, err
	}
	p := &pruner{db: db, r: r, pause: r.Pause, lastUsed: -1}
	if p.pause <= 0 {
		p.pause = 5 * time.Millisecond
	}
	err := p.prune(ctx, now)
	return p.total, err
}

// pruner is one run of Prune, owned by the goroutine that called it.
type pruner struct {
	db       *AgentStore
	r        Retention
	pause    time.Duration // between two batches
	total    Deleted       // what was deleted so far
	lastUsed int64         // the store's size at the last round for MaxBytes; -1 before the first
}

// prune removes what is older than MaxAge, then brings the store under
// MaxBytes, giving the freed pages back after each.
func (p *pruner) prune(ctx context.Context, now time.Time) error {
	if p.r.MaxAge > 0 {
		if err := p.pruneOlder(ctx, now.Add(-p.r.MaxAge).UnixMicro()); err != nil {
			return err
		}
	}
	if err := p.db.vacuum(ctx); err != nil {
		return err
	}
	if p.r.MaxBytes <= 0 {
		return nil
	}
	for round := 0; round < 8; round++ {
		done, err := p.sizeRound(ctx)
		if err != nil || done {
			return err
		}
	}
	return nil
}

// pruneOlder deletes the prunable captures created before cutoff
// (microseconds), and the media files of no capture created before it.
func (p *pruner) pruneOlder(ctx context.Context, cutoff int64) error {
	if err := p.deleteAll(ctx, p.r.prunable()+" AND c.created_at < ?", cutoff); err != nil {
		return err
	}
	d, err := p.db.deleteMediaWhere(ctx, "capture_id = '' AND created_at < ?", cutoff)
	p.total.add(d)
	return err
}

// sizeRound, while the store is over MaxBytes, deletes the oldest
// prunable captures until what was deleted covers the excess, then gives
// the pages back; the caller measures again, since the estimate counts
// bodies, not rows. It reports whether pruning for size is done: under the
// limit, nothing prunable left, or nothing measurable freed.
func (p *pruner) sizeRound(ctx context.Context) (done bool, err error) {
	used, err := p.db.DiskUsage()
	if err != nil {
		return true, err
	}
	excess := used - p.r.MaxBytes
	if excess <= 0 {
		return true, nil
	}
	// What the last round deleted did not show on disk (a WAL a reader
	// kept from truncating, blocks the file system keeps): deleting
	// more on that reading would empty the store. The next prune,
	// minutes later, measures again.
	if p.lastUsed >= 0 && used >= p.lastUsed {
		slog.Warn("storage: a prune freed no measurable space; trying again at the next one", "used", used, "limit", p.r.MaxBytes)
		return true, nil
	}
	p.lastUsed = used
	before := p.total.Captures
	upto, err := p.db.oldestCovering(ctx, p.r, excess)
	if err != nil {
		return true, err
	}
	if upto > 0 {
		if err := p.deleteAll(ctx, p.r.prunable()+" AND c.seq <= ?", upto); err != nil {
			return true, err
		}
	}
	if err := p.db.vacuum(ctx); err != nil {
		return true, err
	}
	return p.total.Captures == before, nil // equal: nothing prunable is left
}

// deleteAll deletes the captures matching cond a batch at a time, pausing
// between batches so that the capture writer and the indexer get the locks.
func (p *pruner) deleteAll(ctx context.Context, cond string, args ...any) error {
	for {
		d, more, err := p.db.deleteWhere(ctx, cond, args, deleteBatchMax)
		p.total.add(d)
		if err != nil || !more {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.pause):
		}
	}
}

// oldestCovering is the seq up to which the prunable captures, oldest
// first, hold excess bytes (by their bodies and rowOverhead each); 0 when
// none is prunable.
func (db *AgentStore) oldestCovering(ctx context.Context, r Retention, excess int64) (int64, error) {
	rows, err := db.read.QueryContext(ctx, `SELECT c.seq, c.size + coalesce(length(c.response_body), 0) FROM captures c WHERE `+r.prunable()+` ORDER BY c.seq`)
	if err != nil {
		return 0, fmt.Errorf("storage: oldest captures: %w", err)
	}
	defer rows.Close()
	var upto, held int64
	for held < excess && rows.Next() {
		var seq, size int64
		if err := rows.Scan(&seq, &size); err != nil {
			return 0, fmt.Errorf("storage: oldest captures: %w", err)
		}
		upto, held = seq, held+size+rowOverhead
	}
	return upto, rows.Err()
}

// rowOverhead is a capture's bytes in the database and index beside its
// bodies (columns, headers, index entries), for Prune's estimate.
const rowOverhead = 2048

// vacuum hands the database pages that deletions freed back to the file
// system (auto_vacuum is incremental: migration 0012), in the store and
// in the search index, whose entries FTS4 removes by merging segments.
func (db *AgentStore) vacuum(ctx context.Context) error {
	conn, err := db.index.DB().Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// FTS4 records a deletion as new segment data, and frees the old
	// entries only when all segments merge into one: a partial merge
	// ('merge=X,Y') left the index larger than before the prune. This
	// runs on the indexer's connection, off the capture writer's path.
	if _, err := conn.ExecContext(ctx, `INSERT INTO search.captures_fts (captures_fts) VALUES ('optimize')`); err != nil {
		return db.index.Damage(fmt.Errorf("storage: merge the search index: %w", err))
	}
	for _, schema := range []string{"search", "main"} {
		if err := db.vacuumSchema(ctx, conn, schema); err != nil {
			return err
		}
	}
	return nil
}

// vacuumSchema frees schema's free pages and truncates its WAL. The
// store's own (main) is written between the capture writer's
// transactions, as a deletion is (writeGate).
func (db *AgentStore) vacuumSchema(ctx context.Context, conn *sql.Conn, schema string) error {
	if schema == "main" {
		db.writeGate.Lock()
		defer db.writeGate.Unlock()
	}
	if err := storage.IncrementalVacuum(ctx, conn, schema); err != nil {
		return err
	}
	// The WAL holds a copy of every page the prune touched, and keeps
	// its size after a checkpoint: truncate it. A reader in the way
	// makes this a no-op (busy), tried again at the next prune.
	return truncateWAL(ctx, conn, schema)
}

// truncateWAL checkpoints schema's WAL and truncates it, trying a few
// times while a reader's snapshot is in the way (SQLite then answers
// busy rather than an error): the indexer reads in short transactions.
func truncateWAL(ctx context.Context, conn *sql.Conn, schema string) error {
	for try := 0; ; try++ {
		var busy, logPages, done int
		if err := conn.QueryRowContext(ctx, `PRAGMA `+schema+`.wal_checkpoint(TRUNCATE)`).Scan(&busy, &logPages, &done); err != nil {
			return fmt.Errorf("storage: checkpoint %s: %w", schema, err)
		}
		if busy == 0 || try == 20 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(try+1) * 5 * time.Millisecond):
		}
	}
}

// DiskUsage is the space the store's files take on disk: the database and
// its WAL, the search index, body segments (their blocks: deleted spans
// are holes) and saved media.
func (db *AgentStore) DiskUsage() (int64, error) {
	var total int64
	for _, p := range []string{db.path, db.path + "-wal", SearchIndexPath(db.path), SearchIndexPath(db.path) + "-wal"} {
		n, err := fileUsage(p)
		if err != nil {
			return 0, err
		}
		total += n
	}
	for _, dir := range []string{BodiesDir(db.path), MediaDir(db.path)} {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.Type().IsRegular() {
				n, err := fileUsage(p)
				total += n
				return err
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("storage: disk usage: %w", err)
		}
	}
	return total, nil
}

// fileUsage is the bytes a file takes on disk (its blocks where the
// system says, else its size); 0 if it does not exist.
func fileUsage(path string) (int64, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("storage: disk usage: %w", err)
	}
	return intake.Allocated(fi), nil
}

// RunRetention prunes now and then every interval, until ctx ends. A
// failed pass is logged and tried again at the next.
func (db *AgentStore) RunRetention(ctx context.Context, r Retention, interval time.Duration, log *slog.Logger) {
	if r.MaxAge <= 0 && r.MaxBytes <= 0 {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d, err := db.Prune(ctx, r, time.Now())
		if err != nil && ctx.Err() == nil {
			log.Warn("retention: pruning old captures", "err", err)
		} else if d.Captures > 0 || d.Media > 0 {
			log.Info("retention: pruned old captures", "captures", d.Captures, "media", d.Media, "bytes", d.Bytes)
		}
		t.Reset(interval)
	}
}
