package agentdb

// Writing captures: WriteCaptures (used by import, and by a store without
// an intake log), through the insert step (insert.go) and the update step
// (update.go) that the intake log's apply (intake.go) shares.

import (
	"context"
	"errors"

	"github.com/calltap/calltap/storage/intake"
)

// WriteCaptures saves new captures and the responses of earlier ones in one
// transaction: the agent batches whatever arrived while the previous commit
// ran, so a burst costs one commit, not one per request. It returns what it
// assigned to each insert, in order, and leaves the captures it was given
// as they were (but for where a large body it wrote for them lies, so that
// a second try does not write it again).
//
// It runs on the driver's connection itself (see writer.go): statements
// prepared once, no goroutine per statement. ctx is only checked between
// statements.
//
// Captures reach the full-text index later, in a file of their own (see
// searchindex.go). While the index is further behind than its bound,
// WriteCaptures keeps to the indexer's pace.
func (db *AgentStore) WriteCaptures(ctx context.Context, inserts, updates []*Capture) (_ []Written, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	if db.index != nil && len(inserts) > 0 {
		if err := db.index.WaitRoom(ctx, len(inserts)); err != nil {
			return nil, err
		}
	}
	written := make([]Written, len(inserts))
	var last int64
	err = db.writeRaw(ctx, func(w *rawConn) (err error) {
		last, err = w.writeBatch(ctx, inserts, updates, written)
		return err
	})
	if errors.Is(err, intake.ErrSegmentSync) {
		unstage(inserts)
	}
	if err != nil {
		return nil, err
	}
	if db.index != nil && last > 0 {
		db.index.Saved(last)
	}
	if db.intake != nil {
		db.intake.noteSaved(inserts)
	}
	return written, nil
}

// writeBatch inserts and updates in w's transaction, filling written, and
// returns the last seq it inserted (0 if none). ctx is checked between
// statements.
func (w *rawConn) writeBatch(ctx context.Context, inserts, updates []*Capture, written []Written) (last int64, err error) {
	for i, c := range inserts {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if written[i], err = w.insertCapture(c); err != nil {
			return 0, err
		}
		if !written[i].Redelivered {
			last = max(last, written[i].Seq)
		}
	}
	for _, c := range updates {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := w.updateCapture(c); err != nil {
			return 0, err
		}
	}
	return last, nil
}

// insertCapture is the insert step of the direct writer: the duplicate
// check in w's transaction, then the insert unless it is a redelivery.
func (w *rawConn) insertCapture(c *Capture) (Written, error) {
	out, err := checkDuplicate(context.Background(), c, w)
	if err != nil || out.Redelivered {
		return out, err
	}
	return w.insert(c, out)
}
