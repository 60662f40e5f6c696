package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/storage/agentdb/idfilter"
	"github.com/calltap/calltap/storage/intake"
)

// The intake log is the agent store's answer path. A request's capture is
// durable once LogCaptures has appended it to the log and synced the log:
// one write and one fdatasync for a whole batch, where a SQLite commit
// writes a WAL frame per page it touches (the row, five indexes, the body
// table: some thirty writes a request) and takes file locks around it. The
// SQLite rows, and everything built from them (the search index, call
// analysis, listings), are applied from the log later, off the answer
// path, in large batches (applyLoop): a batch of applied records is one
// SQLite commit at synchronous=NORMAL, however many requests it holds. A
// log file is deleted only after the WAL holding the commits that applied
// it is synced.
//
// Order and exactly once: records are applied in the order they were
// appended, and the position after the last applied record (generation,
// offset) is written in the same SQLite transaction as the rows it applied
// (intake_state). A crash between the log's sync and the apply leaves
// records past that position: the next open applies them, and only them.
// A record torn by the crash (its frame's length or checksum does not
// hold) was never synced, so nobody was told it was saved: the log is cut
// there, and the cut logged. Damage with a whole record after it is not a
// tear, and the open stops (recover).
//
// Readers see every record appended before their call: each read and each
// direct write of an AgentStore applies what is pending first (caughtUp),
// so the inspector's list, the agent's own read of a queued body, a delete
// or a prune always act on everything already answered.
//
// One process owns the log at a time (an exclusive lock on the folder's
// lock file): the agent, opened WithIntake. Any other process opening the
// store applies a log no live owner holds (an agent that was killed) and
// writes to SQLite directly; while an agent owns the log, another process
// opening the store waits until the agent has applied every record the log
// held when it opened (ownerCaughtUp, owner.go), so it too sees every
// request already answered.
//
// The log's files, their frames and what is synced when are
// storage/intake's (its package comment); each record's payload is a
// capture's insert or update (intakerecord.go).

// applyBatch is the most records applied in one SQLite transaction.
const applyBatch = 512

// defaultApplyDelay is how long the first pending record waits, at most, to be
// applied (readers in this process never wait for it: they apply what is
// pending first); a variable for tests.
const defaultApplyDelay = 50 * time.Millisecond

// The log files live among the body segments (BodiesDir): a request's
// body stays where the log wrote it, and the store names its file and
// offset (capture_bodies), as it does for a body in a segment. A log file
// is deleted once it is applied and no capture names it any more
// (retention, deletes).

// pos is a place in the log: a file's generation and an offset in it.
type pos struct {
	gen int64
	off int64
}

// logged is one appended record waiting to be applied.
type logged struct {
	rec        []byte // the payload
	end        pos    // just past its frame
	deliveryID string // an insert's delivery id and capture id, for duplicate look-ups while pending
	relayID    string // a queued insert's relay id, for redelivery look-ups while pending
	id         string
	// first is the delivery's first capture: id, or the one id repeats
	// (byDeliver holds it for deliveryID while this record is pending).
	first string
}

// intakeLog is an agent store's log: its writer (LogCaptures), the records
// not yet applied, and the goroutine that applies them.
type intakeLog struct {
	db    *AgentStore
	dir   string
	sync  bool          // storage.SyncFull: a batch with inserts is fdatasynced before LogCaptures returns
	delay time.Duration // how long the first pending record waits, at most, to be applied (defaultApplyDelay; a test's option sets another)
	lock  *os.File      // the folder's lock file, held exclusively while open

	// mu is held by LogCaptures for a whole append, and by the indexer's
	// Touch under it (lock order: inspector/agent's package comment).
	mu        sync.Mutex
	log       *intake.Log       // guarded by mu: the file appended to
	pending   []logged          // guarded by mu: appended, not yet applied, in order
	byDeliver map[string]string // guarded by mu: delivery id → the first pending capture's id
	byRelay   map[string]string // guarded by mu: relay id → the pending capture's id
	ids       *idfilter.Filter  // guarded by mu: the store's delivery ids (storage/agentdb/idfilter; buildIDFilter); nil until built
	committed deliveryIndex     // guarded by mu: what SQLite holds: db (openIntake); read when ids may hold an id
	closed    bool              // guarded by mu: set by close

	npending atomic.Int64 // len(pending), read without mu

	applyMu sync.Mutex // held while applying: by applyLoop, or a reader catching up; taken before mu and the store's write locks
	applied pos        // guarded by applyMu: the position recorded in intake_state
	failed  error      // guarded by applyMu: the last apply's error, nil once one succeeds

	filterDone chan struct{} // closed once buildIDFilter returns
	wake       chan struct{} // pokes applyLoop: a record was appended
	stop       chan struct{}
	done       chan struct{}
}

// forget drops the look-up entries of p. Called with mu held.
func (in *intakeLog) forget(p logged) {
	if p.deliveryID != "" && in.byDeliver[p.deliveryID] == p.first {
		delete(in.byDeliver, p.deliveryID)
	}
	if p.relayID != "" && in.byRelay[p.relayID] == p.id {
		delete(in.byRelay, p.relayID)
	}
}

// deliveryIndex finds the first capture of a delivery id among those
// committed to SQLite. The store is one; the tests of the delivery-id
// filter count its reads through another.
type deliveryIndex interface {
	firstOfDelivery(ctx context.Context, deliveryID string) (string, error)
}

// firstOfDelivery returns the first committed capture with delivery id d,
// or "" if none has it.
func (db *AgentStore) firstOfDelivery(ctx context.Context, d string) (string, error) {
	var id string
	err := db.read.QueryRowContext(ctx, qSelDup, d).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// applyLoop applies pending records: in.delay after the first of a
// quiet spell, or at once when applyBatch are waiting.
func (in *intakeLog) applyLoop() {
	defer close(in.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-in.wake:
		case <-in.stop:
			return
		}
		if in.npending.Load() < applyBatch {
			timer.Reset(in.delay)
			select {
			case <-timer.C:
			case <-in.stop:
				timer.Stop()
				return
			}
		}
		if err := in.catchUp(context.Background()); err != nil {
			// Tried again after a pause; readers meanwhile get the error.
			timer.Reset(time.Second)
			select {
			case <-timer.C:
			case <-in.stop:
				return
			}
			select {
			case in.wake <- struct{}{}:
			default:
			}
		}
	}
}

// catchUp applies every record appended before it was called.
func (in *intakeLog) catchUp(ctx context.Context) error {
	if in.npending.Load() == 0 {
		return nil
	}
	in.applyMu.Lock()
	defer in.applyMu.Unlock()
	in.mu.Lock()
	target := len(in.pending)
	in.mu.Unlock()
	for target > 0 {
		in.mu.Lock()
		n := min(target, applyBatch, len(in.pending))
		batch := append([]logged(nil), in.pending[:n]...)
		in.mu.Unlock()
		if n == 0 {
			return nil
		}
		if err := in.apply(ctx, batch); err != nil {
			in.failed = err
			return err
		}
		in.failed = nil
		in.mu.Lock()
		for _, p := range in.pending[:n] {
			in.forget(p)
		}
		in.pending = append(in.pending[:0], in.pending[n:]...)
		in.npending.Store(int64(len(in.pending)))
		in.mu.Unlock()
		target -= n
	}
	return nil
}

// apply writes batch to SQLite in one transaction with the position after
// its last record, and deletes log files it has moved past. Called with
// applyMu held (or from recover, before anyone else can).
func (in *intakeLog) apply(ctx context.Context, batch []logged) error {
	db := in.db
	if db.index != nil {
		if err := db.index.WaitRoom(ctx, len(batch)); err != nil {
			return err
		}
	}
	var last int64
	end := batch[len(batch)-1].end
	// Not synced: the log holds these records, synced, until a
	// checkpoint has made this commit durable (below).
	err := db.writeRawDurable(ctx, false, func(w *rawConn) error {
		for _, p := range batch {
			seq, err := w.applyRecord(p)
			if err != nil {
				return err
			}
			last = max(last, seq)
		}
		return w.setApplied(end)
	})
	if err != nil {
		return err
	}
	old := in.applied
	in.applied = end
	if old.gen < end.gen {
		var gens []int64
		for g := old.gen; g < end.gen; g++ {
			gens = append(gens, g)
		}
		if err := in.dropApplied(gens); err != nil {
			return err
		}
	}
	if db.index != nil && last > 0 {
		db.index.Saved(last)
	}
	return nil
}

// applyRecord writes the record p in w's transaction: an insert's insert
// step (its duplicate was looked up when it was logged, and a redelivery
// was never logged), its body left in the log; or an update. It returns
// the seq inserted (0 for an update).
func (w *rawConn) applyRecord(p logged) (int64, error) {
	kind, c, bodyAt, err := decodeRecord(p.rec)
	if err != nil {
		return 0, fmt.Errorf("storage: intake record before %d in log %d: %w", p.end.off, p.end.gen, err)
	}
	if kind == recUpdate {
		return 0, w.updateCapture(c)
	}
	bodyInLog(c, intake.Name(p.end.gen), p.end.off-int64(len(p.rec))+int64(bodyAt))
	wr, err := w.insert(c, Written{ID: c.ID, DuplicateOf: c.DuplicateOf})
	return wr.Seq, err
}

// dropApplied deletes the applied logs of gens that no capture names, once
// the commits that applied them are on disk (a commit at
// synchronous=NORMAL is not until the WAL is synced).
func (in *intakeLog) dropApplied(gens []int64) error {
	if len(gens) == 0 {
		return nil
	}
	if err := in.db.syncWAL(); err != nil {
		return err
	}
	for _, g := range gens {
		if err := in.db.removeSegmentIfUnused(intake.Name(g)); err != nil {
			return fmt.Errorf("storage: remove an applied intake log: %w", err)
		}
	}
	return nil
}

// syncWAL makes every commit made so far durable, those made at
// synchronous=NORMAL included: it syncs the WAL file (an fsync through any
// descriptor writes the file's dirty pages, whoever wrote them).
func (db *AgentStore) syncWAL() error {
	f, err := os.Open(db.path + "-wal")
	if errors.Is(err, os.ErrNotExist) {
		return nil // checkpointed and removed: in the database, synced
	}
	if err != nil {
		return fmt.Errorf("storage: sync the WAL: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("storage: sync the WAL: %w", err)
	}
	return nil
}

// setApplied records p as the intake position, in the transaction of the
// records it follows.
func (w *rawConn) setApplied(p pos) error {
	if _, err := w.exec(`UPDATE intake_state SET applied_gen = ?, applied_end = ?`, p.gen, p.off); err != nil {
		return fmt.Errorf("storage: record the intake position: %w", err)
	}
	return nil
}

// close stops applyLoop, applies what is pending, and closes the files.
func (in *intakeLog) close() error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil
	}
	in.closed = true
	in.mu.Unlock()
	close(in.stop)
	<-in.done
	<-in.filterDone
	err := in.catchUp(context.Background())
	in.mu.Lock()
	defer in.mu.Unlock()
	return errors.Join(err, in.log.Close(), in.lock.Close())
}

// caughtUp applies, before a read or a direct write, every record logged
// before it.
func (db *AgentStore) caughtUp(ctx context.Context) error {
	if db.intake == nil {
		return nil
	}
	return db.intake.catchUp(ctx)
}

// buildIDFilter fills a filter with the store's delivery ids, off the
// answer path, and hands it to LogCaptures. Until then every check reads
// SQLite. The ids saved while it reads are added under mu, which
// LogCaptures holds: those committed since the big read, and those still
// pending (a record leaves pending only once committed).
func (in *intakeLog) buildIDFilter() {
	defer close(in.filterDone)
	ctx := context.Background()
	f := idfilter.New()
	var upto int64
	if err := in.db.read.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM captures`).Scan(&upto); err != nil {
		return // every check keeps reading SQLite
	}
	if err := addStored(ctx, f, in.db.read, `seq <= ?`, upto); err != nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return
	}
	if err := addStored(ctx, f, in.db.read, `seq > ?`, upto); err != nil {
		return
	}
	for d := range in.byDeliver {
		f.Add(d)
	}
	in.ids = f
}

// noteSaved adds the delivery ids of captures written straight to SQLite
// (WriteCaptures: imports, replays of this process) to the filter.
func (in *intakeLog) noteSaved(cs []*Capture) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.ids == nil {
		return
	}
	for _, c := range cs {
		if c.DeliveryID != "" {
			in.ids.Add(c.DeliveryID)
		}
	}
}

// loggedOf is the records of log gen as records to apply.
func loggedOf(gen int64, recs []intake.Record) []logged {
	out := make([]logged, len(recs))
	for i, r := range recs {
		out[i] = logged{rec: r.Payload, end: pos{gen, r.End}}
	}
	return out
}
