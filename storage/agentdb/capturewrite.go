package agentdb

// Writing captures: WriteCaptures (used by import, and by a store without
// an intake log), and the insert and update statements on the write
// connection that the intake log's apply (intake.go) shares.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

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

// The writer's statements, prepared once on the write connection.
const (
	qInsert = `INSERT INTO captures (id, relay_id, source, created_at, arrived_at, queued, method, path, query,
		request_headers, size, target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, max_attempts, route)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	qBodyIns = `INSERT INTO capture_bodies (seq, body, file, file_offset) VALUES (?, ?, ?, ?)`
	qUpdate  = `UPDATE captures SET status = ?, response_status = ?, response_headers = ?, response_body = ?,
		error = ?, duration_us = ?, delivered_at = ?, attempts = ?, max_attempts = ?, target = ?,
		queued = queued OR ?, arrived_at = COALESCE(arrived_at, ?) WHERE id = ?`
	qAttIns = `INSERT OR REPLACE INTO attempts (capture_id, n, at, response_status, error, duration_us) VALUES (?, ?, ?, ?, ?, ?)`
)

// nstr is s as a driver value, NULL when empty.
func nstr(s string) driver.Value {
	if s == "" {
		return nil
	}
	return s
}

// nmicros is t in unix µs as a driver value, NULL when zero.
func nmicros(t time.Time) driver.Value {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
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

// insert writes capture c as out says (its duplicate looked up, not a
// redelivery), its body where bodyColumns says, and returns out with its
// Seq: the statements of the insert step.
func (w *rawConn) insert(c *Capture, out Written) (Written, error) {
	status, maxAttempts, headers := c.Status, c.MaxAttempts, c.RequestHeaders
	if status == "" {
		status = StatusPending
	}
	if maxAttempts == 0 {
		maxAttempts = 1
	}
	if headers == "" {
		headers = "[]"
	}
	if err := stageBody(w.bodies, c); err != nil { // if not staged already
		return out, err
	}
	size, stored, file, offset := bodyColumns(c)
	seq, err := w.exec(qInsert,
		c.ID, nstr(c.RelayID), c.Source, c.CreatedAt.UnixMicro(), nmicros(c.ArrivedAt), c.Queued, c.Method, c.Path, c.Query,
		headers, size, c.Target, nstr(c.Event), nstr(c.CallID), nstr(c.DeliveryID), nstr(c.OccurredAt),
		nstr(out.DuplicateOf), nstr(c.ReplayOf), status, int64(maxAttempts), nstr(c.Route))
	if err != nil {
		return out, fmt.Errorf("storage: insert capture: %w", err)
	}
	out.Seq = seq
	if _, err := w.exec(qBodyIns, seq, stored, file, offset); err != nil {
		return out, fmt.Errorf("storage: insert capture body: %w", err)
	}
	return out, nil
}

func (w *rawConn) updateCapture(c *Capture) error {
	var status, dur driver.Value
	if c.ResponseStatus > 0 {
		status = int64(c.ResponseStatus)
	}
	if c.Duration >= 0 {
		dur = c.Duration.Microseconds()
	}
	var respBody driver.Value
	if c.ResponseBody != nil {
		respBody = c.ResponseBody
	}
	if _, err := w.exec(qUpdate,
		c.Status, status, nstr(c.ResponseHeaders), respBody, nstr(c.Error), dur, nmicros(c.DeliveredAt),
		int64(c.Attempts), int64(c.MaxAttempts), c.Target, c.Queued, nmicros(c.ArrivedAt), c.ID); err != nil {
		return fmt.Errorf("storage: record response: %w", err)
	}
	if c.LastAttempt == nil {
		return nil
	}
	a := *c.LastAttempt
	var astatus driver.Value
	if a.ResponseStatus > 0 {
		astatus = int64(a.ResponseStatus)
	}
	if _, err := w.exec(qAttIns, c.ID, int64(a.N), a.At.UnixMicro(), astatus, nstr(a.Error), a.Duration.Microseconds()); err != nil {
		return fmt.Errorf("storage: record attempt: %w", err)
	}
	return nil
}
