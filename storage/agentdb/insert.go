package agentdb

// The one insert step of a capture, shared by the direct writer
// (WriteCaptures) and the intake log (LogCaptures, and the apply that
// brings its records into SQLite):
//
//   - the duplicate check (checkDuplicate): a queued capture whose relay
//     id was saved before is a redelivery, and nothing is inserted; else a
//     capture whose delivery id was seen before is a duplicate of the
//     first. The direct writer asks its transaction (rawConn), the log
//     asks what it holds pending, then the store (intakeLog); both by the
//     same statements (qSelRelay, qSelDup);
//   - where the body goes (stageBody, unstage, bodyInLog, bodyColumns):
//     inline in capture_bodies, in a body segment when it is kept apart,
//     or left in the intake log where the log wrote it;
//   - the statements (rawConn.insert).

import (
	"context"
	"database/sql/driver"
	"fmt"
	"time"

	"github.com/calltap/calltap/storage/intake"
)

// The duplicate check's statements.
const (
	qSelRelay = `SELECT seq, id FROM captures WHERE relay_id = ? AND queued = 1`
	qSelDup   = `SELECT id FROM captures WHERE delivery_id = ? ORDER BY seq LIMIT 1`
)

// saved is what the duplicate check asks of a writer: the queued capture
// saved with relay id r (ok false if none), and the first capture with
// delivery id d ("" if none).
type saved interface {
	redelivery(ctx context.Context, r string) (id string, seq int64, ok bool, err error)
	firstOf(ctx context.Context, d string) (string, error)
}

// checkDuplicate is the duplicate check of capture c against what s has
// saved: the Written of c, Redelivered (with the first copy's ID and Seq)
// if nothing is to be inserted.
func checkDuplicate(ctx context.Context, c *Capture, s saved) (Written, error) {
	out := Written{ID: c.ID, DuplicateOf: c.DuplicateOf}
	// Only a queued request is ever sent again (our ack was lost).
	if r := queuedRelayID(c); r != "" {
		id, seq, ok, err := s.redelivery(ctx, r)
		if err != nil {
			return out, fmt.Errorf("storage: look up relay id: %w", err)
		}
		if ok {
			out.ID, out.Seq, out.Redelivered = id, seq, true
			return out, nil
		}
	}
	if c.DeliveryID != "" && out.DuplicateOf == "" {
		first, err := s.firstOf(ctx, c.DeliveryID)
		if err != nil {
			return out, fmt.Errorf("storage: look up delivery id: %w", err)
		}
		out.DuplicateOf = first
	}
	return out, nil
}

// queuedRelayID is the relay id a redelivery of c would be found by.
func queuedRelayID(c *Capture) string {
	if c.Queued {
		return c.RelayID
	}
	return ""
}

// redelivery looks relay id r up in the writer's transaction.
func (w *rawConn) redelivery(_ context.Context, r string) (id string, seq int64, ok bool, err error) {
	ok, err = w.queryRow(qSelRelay, []driver.Value{r}, &seq, &id)
	return id, seq, ok, err
}

// firstOf looks delivery id d up in the writer's transaction.
func (w *rawConn) firstOf(_ context.Context, d string) (string, error) {
	var id string
	_, err := w.queryRow(qSelDup, []driver.Value{d}, &id)
	return id, err
}

// stageBody writes c's body to a segment of bodies, if it is kept apart
// and not written yet, and notes where it is: before any transaction or
// log record names it. A store without segments (nil) keeps it inline.
func stageBody(bodies *intake.Bodies, c *Capture) error {
	if bodies == nil || !intake.KeptApart(len(c.Body)) || c.bodyFile != "" {
		return nil
	}
	name, off, err := bodies.Append(c.Body)
	if err != nil {
		return err
	}
	c.bodyFile, c.bodyOffset = name, off
	return nil
}

// unstage forgets where the kept-apart bodies of cs were written, after a
// failed sync of their segments (intake.ErrSegmentSync): they are written
// again, to a new segment, should the caller try again.
func unstage(cs []*Capture) {
	for _, c := range cs {
		if intake.KeptApart(len(c.Body)) {
			c.bodyFile, c.bodyOffset = "", 0
		}
	}
}

// bodyInLog leaves c's inline body where the intake log wrote it, at
// offset off of the log file name: the store names the file and offset,
// as for a body in a segment.
func bodyInLog(c *Capture, name string, off int64) {
	if len(c.Body) == 0 {
		return
	}
	c.bodyFile, c.bodyOffset = name, off
	c.Size, c.Body = len(c.Body), nil
}

// bodyColumns is what capture_bodies holds for c: its size, and the body
// inline, or an empty body and the file and offset that hold it (a
// segment, or the intake log).
func bodyColumns(c *Capture) (size int64, stored []byte, file, offset driver.Value) {
	if c.bodyFile == "" {
		if c.Body == nil {
			return 0, []byte{}, nil, nil
		}
		return int64(len(c.Body)), c.Body, nil, nil
	}
	size = int64(len(c.Body))
	if len(c.Body) == 0 { // from the intake log: the size was recorded
		size = int64(c.Size)
	}
	return size, []byte{}, c.bodyFile, c.bodyOffset
}

// The insert step's statements, prepared once on the write connection.
const (
	qInsert = `INSERT INTO captures (id, relay_id, source, created_at, arrived_at, queued, method, path, query,
		request_headers, size, target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, max_attempts, route)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	qBodyIns = `INSERT INTO capture_bodies (seq, body, file, file_offset) VALUES (?, ?, ?, ?)`
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
