package agentdb

import (
	"database/sql/driver"
	"fmt"
)

// The one update step of a capture, its response and last attempt,
// shared by the direct writer (WriteCaptures) and the intake log's apply.

// The update step's statements, prepared once on the write connection.
const (
	qUpdate = `UPDATE captures SET status = ?, response_status = ?, response_headers = ?, response_body = ?,
		error = ?, duration_us = ?, delivered_at = ?, attempts = ?, max_attempts = ?, target = ?,
		queued = queued OR ?, arrived_at = COALESCE(arrived_at, ?) WHERE id = ?`
	qAttIns = `INSERT OR REPLACE INTO attempts (capture_id, n, at, response_status, error, duration_us) VALUES (?, ?, ?, ?, ?, ?)`
)

// updateCapture records c's response, and its last attempt if it has one.
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
