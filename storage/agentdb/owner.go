package agentdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/calltap/calltap/storage/intake"
)

// The agent that owns a store's intake log, as another process sees it:
// whether there is one is asked of the lock on the log's folder
// (storage/agentdb/intakelock), and a process that reads the store waits
// until that agent has applied what it answered (ownerCaughtUp).

// ownerWait bounds how long a reader waits for a live agent to apply its
// log or index its captures: the agent applies within its apply delay, and
// retries a failed apply (a full disk) every second.
const ownerWait = 5 * time.Second

// ownerCaughtUp waits until the agent owning the intake log has applied
// every record the log holds now: every request it has answered. After
// ownerWait it gives up with a warning, and the read goes on without
// what is left: reading must not fail because the agent cannot write.
func (db *AgentStore) ownerCaughtUp(ctx context.Context) error {
	target, recs, err := db.logEnd(ctx)
	if err != nil || len(recs) == 0 {
		return err
	}
	deadline := time.Now().Add(ownerWait)
	for {
		at, err := db.appliedPos(ctx)
		if err != nil {
			return err
		}
		if !at.before(target) {
			return nil
		}
		if time.Now().After(deadline) {
			slog.Warn("storage: the agent running on this store has not applied requests it answered; this read leaves them out",
				"store", db.path, "records", len(recs))
			return nil
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// appliedPos is the intake position recorded in the store.
func (db *AgentStore) appliedPos(ctx context.Context) (pos, error) {
	var p pos
	if err := db.read.QueryRowContext(ctx, `SELECT applied_gen, applied_end FROM intake_state`).Scan(&p.gen, &p.off); err != nil {
		return p, fmt.Errorf("storage: intake position: %w", err)
	}
	return p, nil
}

// before reports whether p comes before q in the log.
func (p pos) before(q pos) bool {
	return p.gen < q.gen || (p.gen == q.gen && p.off < q.off)
}

// logEnd reads the intake log, without writing, from the recorded
// position: it returns the end of its last whole record and the records
// past the position.
func (db *AgentStore) logEnd(ctx context.Context) (end pos, records []logged, err error) {
	applied, err := db.appliedPos(ctx)
	if err != nil {
		return pos{}, nil, err
	}
	dir := BodiesDir(db.path)
	gens, err := intake.Files(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return applied, nil, nil
	} else if err != nil {
		return pos{}, nil, err
	}
	end = applied
	for _, g := range gens {
		if g < applied.gen {
			continue
		}
		start := int64(0)
		if g == applied.gen {
			start = applied.off
		}
		// Damage past the last whole record is a write in progress (the
		// agent's) or a torn tail its next start cuts: not ours to judge.
		scan, err := intake.ReadLog(filepath.Join(dir, intake.Name(g)), start)
		if errors.Is(err, fs.ErrNotExist) {
			continue // applied and deleted meanwhile
		} else if err != nil {
			return pos{}, nil, err
		}
		if recs := loggedOf(g, scan.Records); len(recs) > 0 {
			end, records = recs[len(recs)-1].end, append(records, recs...)
		}
	}
	return end, records, nil
}
