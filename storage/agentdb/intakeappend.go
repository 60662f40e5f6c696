package agentdb

import (
	"cmp"
	"context"
	"database/sql"
	"errors"

	"github.com/calltap/calltap/storage/intake"
)

// The intake log's append, the agent's answer path: LogCaptures checks
// each insert for a duplicate against what the log holds pending, then the
// store (the log is a saved, insert.go), writes or leaves its body where it
// goes, and appends the batch with one write and one sync; applyLoop
// (intake.go) brings it into SQLite later.

// LogCaptures saves inserts and updates for the agent's answer path: when
// it returns without error, they are durable (under SyncFull) and will be
// in the store, in this order, before any read that starts after it. A
// store opened without WithIntake, or whose log another process owns,
// writes them with WriteCaptures.
//
// Written's Seq is 0: the store numbers a capture when it applies it.
func (db *AgentStore) LogCaptures(ctx context.Context, inserts, updates []*Capture) (_ []Written, err error) {
	in := db.intake
	if in == nil {
		return db.WriteCaptures(ctx, inserts, updates)
	}
	defer db.explain(&err)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil, errors.New("storage: the store is closed")
	}
	if err := in.log.MakeRoom(); err != nil {
		return nil, err
	}
	if err := in.stageBodies(inserts); err != nil {
		return nil, err
	}
	start := len(in.pending)
	// One buffer for the call's frames; each pending record is a slice of
	// it, kept until applied (no copy per record).
	buf := make([]byte, 0, batchSize(inserts, updates))
	written, buf, err := in.logInserts(ctx, buf, inserts)
	if err != nil {
		in.rollback(start)
		return nil, err
	}
	buf = in.logUpdates(buf, updates)
	if len(buf) == 0 {
		return written, nil
	}
	// A batch of updates alone is not synced: the log syncs it before a
	// newer file takes records (intake.Log.Rotate).
	if err := in.log.Append(buf, len(inserts) > 0); err != nil {
		in.rollback(start) // nothing past the last good frame stays (Append)
		return nil, err
	}
	if db.index != nil && len(inserts) > 0 {
		db.index.Touch()
	}
	in.npending.Store(int64(len(in.pending)))
	select {
	case in.wake <- struct{}{}:
	default:
	}
	return written, nil
}

// stageBodies writes the bodies of inserts kept apart to segments, synced
// once, before any record names them (the log's records name their
// segment and offset). Called with mu held.
func (in *intakeLog) stageBodies(inserts []*Capture) error {
	apart := false
	for _, c := range inserts {
		if !intake.KeptApart(len(c.Body)) {
			continue
		}
		apart = true
		if err := stageBody(in.db.bodies, c); err != nil {
			return err
		}
	}
	if !apart || !in.sync {
		return nil
	}
	err := in.db.bodies.SyncWritten()
	if errors.Is(err, intake.ErrSegmentSync) {
		unstage(inserts)
	}
	return err
}

// logInserts appends to buf the records of inserts that the duplicate
// check lets through, and adds them to pending. Called with mu held.
func (in *intakeLog) logInserts(ctx context.Context, buf []byte, inserts []*Capture) ([]Written, []byte, error) {
	written := make([]Written, len(inserts))
	for i, c := range inserts {
		w, err := checkDuplicate(ctx, c, in)
		if err != nil {
			return nil, buf, err
		}
		written[i] = w
		if w.Redelivered {
			continue
		}
		var rec []byte
		buf, rec = intake.AppendFrame(buf, func(b []byte) []byte { return encodeInsert(b, c, w.DuplicateOf) })
		in.addPending(c, rec, w.DuplicateOf, endAfter(in.log, len(buf)))
	}
	return written, buf, nil
}

// addPending adds insert c, logged as rec ending at end, to pending and
// to the look-ups of later duplicate checks. Called with mu held.
func (in *intakeLog) addPending(c *Capture, rec []byte, dup string, end pos) {
	first := cmp.Or(dup, c.ID) // a repeat's first was applied already if byDeliver lacks it
	in.pending = append(in.pending, logged{rec: rec, end: end,
		deliveryID: c.DeliveryID, relayID: queuedRelayID(c), id: c.ID, first: first})
	if c.DeliveryID != "" {
		if _, ok := in.byDeliver[c.DeliveryID]; !ok {
			in.byDeliver[c.DeliveryID] = first
		}
		if in.ids != nil {
			in.ids.Add(c.DeliveryID)
		}
	}
	if r := queuedRelayID(c); r != "" {
		in.byRelay[r] = c.ID
	}
}

// logUpdates appends to buf the records of updates, and adds them to
// pending. Called with mu held.
func (in *intakeLog) logUpdates(buf []byte, updates []*Capture) []byte {
	for _, c := range updates {
		var rec []byte
		buf, rec = intake.AppendFrame(buf, func(b []byte) []byte { return encodeUpdate(b, c) })
		in.pending = append(in.pending, logged{rec: rec, end: endAfter(in.log, len(buf))})
	}
	return buf
}

// rollback drops the records pending from start on: they were not
// written, or not synced. Called with mu held.
func (in *intakeLog) rollback(start int) {
	for _, p := range in.pending[start:] {
		in.forget(p)
	}
	in.pending = in.pending[:start]
}

// endAfter is the position just past n bytes appended to l now.
func endAfter(l *intake.Log, n int) pos {
	gen, off := l.End()
	return pos{gen, off + int64(n)}
}

// firstOf returns the first capture with delivery id d: pending, or in
// the store. A record leaves pending only after its commit, so it is
// always in one or the other. Called with mu held.
func (in *intakeLog) firstOf(ctx context.Context, d string) (string, error) {
	if id, ok := in.byDeliver[d]; ok {
		return id, nil
	}
	if in.ids != nil && !in.ids.MayHave(d) {
		return "", nil // never seen
	}
	return in.committed.firstOfDelivery(ctx, d)
}

// redelivery returns the queued capture with relay id r: pending, or in
// the store. Its Seq is 0, as LogCaptures' are. Called with mu held.
func (in *intakeLog) redelivery(ctx context.Context, r string) (string, int64, bool, error) {
	if id, ok := in.byRelay[r]; ok {
		return id, 0, true, nil
	}
	var id string
	var seq int64
	err := in.db.read.QueryRowContext(ctx, qSelRelay, r).Scan(&seq, &id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, false, nil
	}
	return id, 0, err == nil, err
}
