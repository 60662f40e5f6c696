package agentdb

// The intake log's recovery at open: what a crash or a power cut left in
// the logs is applied, cut or reported before the agent takes requests.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
)

// recover applies the records past intake_state's position, cuts a torn
// last record, and deletes the applied files; if own, it starts a fresh
// file, of a generation past every other.
//
// A torn record is cut, and the start goes on, when no whole record lies
// past it, in its file or a newer one: such a record was never synced (a
// batch is synced whole, and a file before the next one is started), so
// nobody was told it was saved. A newer file with no record in it (made
// ahead, all zeros, or empty) holds nothing anybody was told. Damage with
// a whole record past it is damage to a record that was synced: the start
// stops, having changed nothing, and says what is lost and how to go on.
func (in *intake) recover(ctx context.Context, own bool) error {
	if err := in.db.read.QueryRowContext(ctx, `SELECT applied_gen, applied_end FROM intake_state`).Scan(&in.applied.gen, &in.applied.off); err != nil {
		return fmt.Errorf("storage: intake position: %w", err)
	}
	gens, err := in.files()
	if err != nil {
		return err
	}
	if err := in.checkDamage(gens); err != nil {
		return err
	}
	last := in.applied.gen
	for _, g := range gens {
		last = max(last, g)
		if g < in.applied.gen {
			continue
		}
		s, err := readLog(in.path(g), g, in.startOf(g))
		if err != nil {
			return err
		}
		if s.cut >= 0 {
			if err := in.cutTorn(g, s); err != nil {
				return err
			}
		} else if err := trimReserve(in.path(g), s, in.startOf(g)); err != nil {
			return err
		}
		for recs := s.recs; len(recs) > 0; {
			n := min(len(recs), applyBatch)
			if err := in.apply(ctx, recs[:n]); err != nil {
				return err
			}
			recs = recs[n:]
		}
	}
	// Everything is applied: a new generation, recorded before the old
	// files go (a crash between leaves files older than the recorded
	// generation, which the next open deletes).
	if !own && len(gens) == 0 {
		return nil // nothing was logged since the last open
	}
	next := pos{gen: last + 1}
	if err := in.db.writeRaw(ctx, func(w *rawConn) error { return w.setApplied(next) }); err != nil {
		return err
	}
	in.applied = next
	if err := in.dropApplied(gens); err != nil {
		return err
	}
	if !own {
		return nil
	}
	return in.startFile(next.gen)
}

// trimReserve gives back the zeros reserved past the last record of a log
// no longer written (this open starts a new one): a log that holds bodies
// stays as long as their captures, and each start left 8 MiB of zeros
// behind (the chaos run's 64 MiB disk, seed 3001, filled with them after a
// few restarts, and the agent could start no more). start is where the
// log's unapplied records begin: whole records lie before it.
func trimReserve(path string, s logScan, start int64) error {
	end := start
	if len(s.recs) > 0 {
		end = s.recs[len(s.recs)-1].end.off
	}
	if s.size <= end {
		return nil
	}
	if err := os.Truncate(path, end); err != nil {
		return fmt.Errorf("storage: give back an intake log's reserved space: %w", err)
	}
	return nil
}

// startOf is the offset the records of log gen not yet applied start at.
func (in *intake) startOf(gen int64) int64 {
	if gen == in.applied.gen {
		return in.applied.off
	}
	return 0
}

// checkDamage returns an error if a log of gens not yet applied is damaged
// with a whole record past the damage, in it or in a newer log. It
// changes nothing.
func (in *intake) checkDamage(gens []int64) error {
	var (
		bad    *logScan // the first damage found
		badGen int64
		newer  int // whole records in the logs after badGen's
	)
	for _, g := range gens {
		if g < in.applied.gen {
			continue
		}
		s, err := readLog(in.path(g), g, in.startOf(g))
		if err != nil {
			return err
		}
		switch {
		case bad != nil:
			newer += len(s.recs) + s.after
		case s.cut >= 0:
			bad, badGen = &s, g
			bad.recs = nil // not kept: only counted
		}
	}
	if bad == nil || bad.after+newer == 0 {
		return nil
	}
	return &damageError{path: in.path(badGen), scan: *bad, newer: newer}
}

// damageError is a log damaged before records that were synced.
type damageError struct {
	path  string
	scan  logScan
	newer int // whole records in newer logs
}

func (e *damageError) Error() string {
	s := e.scan
	return fmt.Sprintf("storage: intake log %s is damaged at offset %d: its %d bytes from there hold no whole record "+
		"(%d record(s) lost), and %d whole record(s) follow them (%d in this log, %d in newer logs), so the lost record(s) "+
		"had been synced, and their senders may have been told they were saved. Nothing was changed. To go on without them, cut the log "+
		"at the damage and start again: truncate -s %d %s. That also drops the %d record(s) after the damage in this "+
		"log; the records before offset %d and the %d in newer logs are kept",
		e.path, s.cut, s.skip, s.torn, s.after+e.newer, s.after, e.newer, s.cut, e.path, s.after, s.cut, e.newer)
}

// cutTorn cuts log gen's torn last record (s.cut, no whole record past
// it), and says so.
func (in *intake) cutTorn(gen int64, s logScan) error {
	path := in.path(gen)
	if err := os.Truncate(path, s.cut); err != nil {
		return fmt.Errorf("storage: cut the intake log's torn record: %w", err)
	}
	slog.Warn("storage: cut a torn record off the intake log: a crash left it half written, and no record follows it, so none of what was cut had been acknowledged",
		"file", path, "offset", s.cut, "bytes", s.end-s.cut, "records", s.torn, "acknowledged", 0, "size_before", s.size)
	return nil
}
