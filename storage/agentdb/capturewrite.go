package agentdb

// Writing captures: WriteCaptures (used by import, and by a store without
// an intake log), and the insert and update statements on the write
// connection that the intake log's apply (intake.go) shares.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/calltap/calltap/storage/intake"
	"time"
	"unicode/utf8"
)

// Written is what WriteCaptures assigned to one inserted capture.
type Written struct {
	Seq         int64  // its place in the store
	ID          string // its id: the one given, or the first copy's when Redelivered
	DuplicateOf string // the first capture of the same delivery id, if any
	// Redelivered: a capture with the same RelayID was saved before (the
	// relay sent a queued request again because our ack was lost); that
	// row is kept and nothing was inserted.
	Redelivered bool
}

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
		if err := db.index.waitRoom(ctx, len(inserts)); err != nil {
			return nil, err
		}
	}
	var last int64
	written := make([]Written, len(inserts))
	err = db.writeRaw(ctx, func(w *rawConn) error {
		for i, c := range inserts {
			if err := ctx.Err(); err != nil {
				return err
			}
			var err error
			if written[i], err = w.insertCapture(c); err != nil {
				return err
			}
			if !written[i].Redelivered {
				last = max(last, written[i].Seq)
			}
		}
		for _, c := range updates {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := w.updateCapture(c); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, intake.ErrSegmentSync) {
		// The bodies staged in the segment that failed are written again
		// to a new one, should the caller try again.
		for _, c := range inserts {
			c.bodyFile, c.bodyOffset = "", 0
		}
	}
	if err != nil {
		return nil, err
	}
	if db.index != nil && last > 0 {
		db.index.saved(last)
	}
	if db.intake != nil {
		db.intake.noteSaved(inserts)
	}
	return written, nil
}

// The writer's statements, prepared once on the write connection.
const (
	qSelRelay = `SELECT seq, id FROM captures WHERE relay_id = ? AND queued = 1`
	qSelDup   = `SELECT id FROM captures WHERE delivery_id = ? ORDER BY seq LIMIT 1`
	qInsert   = `INSERT INTO captures (id, relay_id, source, created_at, arrived_at, queued, method, path, query,
		request_headers, size, target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, max_attempts)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
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

func (w *rawConn) insertCapture(c *Capture) (Written, error) {
	out := Written{ID: c.ID, DuplicateOf: c.DuplicateOf}
	if c.RelayID != "" && c.Queued {
		// Only a queued request is ever sent again (our ack was lost).
		ok, err := w.queryRow(qSelRelay, []driver.Value{c.RelayID}, &out.Seq, &out.ID)
		if err != nil {
			return out, fmt.Errorf("storage: look up relay id: %w", err)
		}
		if ok {
			out.Redelivered = true
			return out, nil
		}
	}
	if c.DeliveryID != "" && out.DuplicateOf == "" {
		if _, err := w.queryRow(qSelDup, []driver.Value{c.DeliveryID}, &out.DuplicateOf); err != nil {
			return out, fmt.Errorf("storage: look up delivery id: %w", err)
		}
	}
	return w.insert(c, out)
}

// insert writes capture c as out says (its duplicate looked up, not a
// redelivery) and returns out with its Seq.
func (w *rawConn) insert(c *Capture, out Written) (Written, error) {
	status, maxAttempts, headers, body := c.Status, c.MaxAttempts, c.RequestHeaders, c.Body
	if status == "" {
		status = StatusPending
	}
	if maxAttempts == 0 {
		maxAttempts = 1
	}
	if headers == "" {
		headers = "[]"
	}
	if body == nil {
		body = []byte{}
	}
	stored, file, offset := body, driver.Value(nil), driver.Value(nil)
	size := int64(len(body))
	if len(c.Body) == 0 && c.bodyFile != "" {
		// From the intake log: the body is in its segment already.
		size, stored, file, offset = int64(c.Size), []byte{}, c.bodyFile, c.bodyOffset
	} else if intake.KeptApart(len(body)) && w.bodies != nil {
		if c.bodyFile == "" { // not staged
			name, off, err := w.bodies.Append(body)
			if err != nil {
				return out, err
			}
			c.bodyFile, c.bodyOffset = name, off
		}
		stored, file, offset = []byte{}, c.bodyFile, c.bodyOffset
	}
	seq, err := w.exec(qInsert,
		c.ID, nstr(c.RelayID), c.Source, c.CreatedAt.UnixMicro(), nmicros(c.ArrivedAt), c.Queued, c.Method, c.Path, c.Query,
		headers, size, c.Target, nstr(c.Event), nstr(c.CallID), nstr(c.DeliveryID), nstr(c.OccurredAt),
		nstr(out.DuplicateOf), nstr(c.ReplayOf), status, int64(maxAttempts))
	if err != nil {
		return out, fmt.Errorf("storage: insert capture: %w", err)
	}
	out.Seq = seq
	if _, err := w.exec(qBodyIns, seq, stored, file, offset); err != nil {
		return out, fmt.Errorf("storage: insert capture body: %w", err)
	}
	return out, nil
}

// indexable reports whether a body goes into the full-text index.
func indexable(body []byte) bool {
	return len(body) > 0 && len(body) <= maxIndexedBody && utf8.Valid(body)
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
