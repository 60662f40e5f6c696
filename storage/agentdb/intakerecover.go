package agentdb

// The intake log at open (openIntake): the log folder is taken, or left to
// the live agent that holds it, and what a crash or a power cut left in
// the logs is applied, cut or reported before the agent takes requests.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/intake"
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
// stops, having changed nothing, and says what is lost and how to go on
// (intake.DamageError).
func (in *intakeLog) recover(ctx context.Context, own bool) error {
	if err := in.db.read.QueryRowContext(ctx, `SELECT applied_gen, applied_end FROM intake_state`).Scan(&in.applied.gen, &in.applied.off); err != nil {
		return fmt.Errorf("storage: intake position: %w", err)
	}
	gens, err := intake.Files(in.dir)
	if err != nil {
		return err
	}
	if err := in.log.CheckDamage(in.unapplied(gens), in.startOf); err != nil {
		return err
	}
	last := in.applied.gen
	for _, g := range gens {
		last = max(last, g)
	}
	for _, g := range in.unapplied(gens) {
		if err := in.recoverFile(ctx, g); err != nil {
			return err
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
	return in.log.Start(next.gen)
}

// unapplied is the generations of gens not wholly applied.
func (in *intakeLog) unapplied(gens []int64) []int64 {
	var out []int64
	for _, g := range gens {
		if g >= in.applied.gen {
			out = append(out, g)
		}
	}
	return out
}

// recoverFile applies what log gen holds past the recorded position,
// having cut a torn last record or given back its reserved zeros.
func (in *intakeLog) recoverFile(ctx context.Context, g int64) error {
	path, start := in.log.Path(g), in.startOf(g)
	s, err := intake.ReadLog(path, start)
	if err != nil {
		return err
	}
	if s.Cut >= 0 {
		err = intake.CutTorn(path, s)
	} else {
		err = intake.TrimReserve(path, s, start)
	}
	if err != nil {
		return err
	}
	recs := loggedOf(g, s.Records)
	for len(recs) > 0 {
		n := min(len(recs), applyBatch)
		if err := in.apply(ctx, recs[:n]); err != nil {
			return err
		}
		recs = recs[n:]
	}
	return nil
}

// startOf is the offset the records of log gen not yet applied start at.
func (in *intakeLog) startOf(gen int64) int64 {
	if gen == in.applied.gen {
		return in.applied.off
	}
	return 0
}

// openIntake takes the log folder of db if no live process holds it,
// applies what a previous owner left there, and, if own, keeps it and
// starts a new file to append to, written through disk. It returns nil
// (and applies nothing) when another process owns the log.
func openIntake(ctx context.Context, db *AgentStore, own bool, disk intake.Disk, delay time.Duration) (*intakeLog, error) {
	dir := BodiesDir(db.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("storage: intake folder: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, intake.LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("storage: intake lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			// A live agent owns it: what it has answered is read once
			// it has applied it (ownerCaughtUp, owner.go).
			if own {
				return nil, nil
			}
			return nil, db.ownerCaughtUp(ctx)
		}
		return nil, fmt.Errorf("storage: intake lock: %w", err)
	}
	in := &intakeLog{db: db, dir: dir, sync: db.sync == storage.SyncFull, delay: delay, lock: lock,
		byDeliver: map[string]string{}, byRelay: map[string]string{},
		log:  intake.NewLog(dir, db.sync == storage.SyncFull, db.bodies.SyncDir, intake.WithDisk(disk)),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		filterDone: make(chan struct{}),
		committed:  db}
	if err := in.recover(ctx, own); err != nil {
		lock.Close()
		return nil, err
	}
	if !own {
		lock.Close()
		return nil, nil
	}
	go in.applyLoop()
	go in.buildIDFilter()
	return in, nil
}
