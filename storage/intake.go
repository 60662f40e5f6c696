package storage

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
// there.
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
// sees the agent's captures once they are applied, within applyDelay.
//
// Files: <store>-intake/<generation>.log, records appended to the newest.
// A file past intakeFileMax takes no new record; once every record of a
// generation is applied and a newer one has records applied, it is deleted.
// Each record is framed:
//
//	u32 length of the payload (little endian)
//	u32 CRC-32C of the payload
//	payload: kind (1 insert, 2 update), then the capture's fields in a
//	fixed order (encodeInsert, encodeUpdate)

const (
	intakeFileMax = 8 << 20 // a log file past this takes no new record
	applyBatch    = 512     // records applied in one SQLite transaction, at most
	maxRecord     = 1 << 30 // a frame claiming more is damage
)

// applyDelay is how long the first pending record waits, at most, to be
// applied (readers in this process never wait for it: they apply what is
// pending first); a variable for tests.
var applyDelay = 50 * time.Millisecond

const (
	recInsert byte = 1
	recUpdate byte = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// intakePrefix starts the name of every intake log file. The files live
// among the body segments (BodiesDir): a request's body stays where the
// log wrote it, and the store names its file and offset (capture_bodies),
// as it does for a body in a segment. A log file is deleted once it is
// applied and no capture names it any more (retention, deletes).
const intakePrefix = "intake-"

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
}

// intake is an agent store's log: its writer (LogCaptures), the records
// not yet applied, and the goroutine that applies them.
type intake struct {
	db   *AgentStore
	dir  string
	sync bool     // SyncFull: a batch with inserts is fdatasynced before LogCaptures returns
	lock *os.File // the folder's lock file, held exclusively while open

	mu        sync.Mutex // guards the fields below it; held by LogCaptures for a whole append
	f         *os.File   // the file appended to
	gen       int64      // its generation
	size      int64      // its length: where the next frame goes
	pending   []logged   // appended, not yet applied, in order
	byDeliver map[string]string
	byRelay   map[string]string
	ids       *idFilter // the store's delivery ids (idfilter.go); nil until built
	sqlChecks int       // duplicate checks that read SQLite, for tests
	closed    bool
	preparing bool          // a goroutine prefills generation gen+1's file, to hand it over on nextFile
	nextFile  chan prepared // capacity 1
	// writeAt writes to f; tests replace it to make the disk fail.
	writeAt func(f *os.File, b []byte, off int64) (int, error)

	npending atomic.Int64 // len(pending), read without mu

	applyMu sync.Mutex // held while applying: by applyLoop, or a reader catching up
	applied pos        // guarded by applyMu: the position recorded in intake_state
	failed  error      // guarded by applyMu: the last apply's error, nil once one succeeds

	filterDone chan struct{} // closed once buildIDFilter returns
	wake       chan struct{} // pokes applyLoop: a record was appended
	stop       chan struct{}
	done       chan struct{}
}

// openIntake takes the log folder of db if no live process holds it,
// applies what a previous owner left there, and, if own, keeps it and
// starts a new file to append to. It returns nil (and applies nothing)
// when another process owns the log.
func openIntake(ctx context.Context, db *AgentStore, own bool) (*intake, error) {
	dir := BodiesDir(db.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("storage: intake folder: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, intakePrefix+"lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("storage: intake lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil // a live agent owns it
		}
		return nil, fmt.Errorf("storage: intake lock: %w", err)
	}
	in := &intake{db: db, dir: dir, sync: db.sync == SyncFull, lock: lock,
		byDeliver: map[string]string{}, byRelay: map[string]string{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), nextFile: make(chan prepared, 1),
		filterDone: make(chan struct{}),
		writeAt:    (*os.File).WriteAt}
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

// recover applies the records past intake_state's position, cuts a torn
// last record, and deletes the applied files; if own, it starts a fresh
// file, of a generation past every other.
func (in *intake) recover(ctx context.Context, own bool) error {
	if err := in.db.read.QueryRowContext(ctx, `SELECT applied_gen, applied_end FROM intake_state`).Scan(&in.applied.gen, &in.applied.off); err != nil {
		return fmt.Errorf("storage: intake position: %w", err)
	}
	gens, err := in.files()
	if err != nil {
		return err
	}
	last := in.applied.gen
	for i, g := range gens {
		last = max(last, g)
		if g < in.applied.gen {
			continue
		}
		start := int64(0)
		if g == in.applied.gen {
			start = in.applied.off
		}
		recs, cut, err := readLog(in.path(g), g, start)
		if err != nil {
			return err
		}
		if cut >= 0 {
			if i != len(gens)-1 {
				return fmt.Errorf("storage: intake log %s is damaged at %d, and newer logs follow it", in.path(g), cut)
			}
			// The last record was torn: it was never synced, so nobody
			// was told it was saved.
			if err := os.Truncate(in.path(g), cut); err != nil {
				return fmt.Errorf("storage: cut the intake log's torn record: %w", err)
			}
		}
		for len(recs) > 0 {
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

// files lists the generations of the log files in the folder, oldest first.
func (in *intake) files() ([]int64, error) {
	entries, err := os.ReadDir(in.dir)
	if err != nil {
		return nil, fmt.Errorf("storage: intake folder: %w", err)
	}
	var gens []int64
	for _, e := range entries {
		name, isLog := strings.CutSuffix(e.Name(), ".log")
		num, isIntake := strings.CutPrefix(name, intakePrefix)
		if !isLog || !isIntake {
			continue
		}
		g, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			continue
		}
		gens = append(gens, g)
	}
	sort.Slice(gens, func(i, j int) bool { return gens[i] < gens[j] })
	return gens, nil
}

func (in *intake) path(gen int64) string {
	return filepath.Join(in.dir, logName(gen))
}

// logName is the file name of generation gen's log.
func logName(gen int64) string { return fmt.Sprintf("%s%016d.log", intakePrefix, gen) }

// startFile makes generation gen's file the one appended to.
func (in *intake) startFile(gen int64) error {
	f, err := in.makeFile(gen)
	if err != nil {
		return err
	}
	in.use(f, gen)
	return nil
}

// use makes f, generation gen's file, the one appended to. Called with mu
// held (or before anyone else can).
func (in *intake) use(f *os.File, gen int64) {
	if in.f != nil {
		in.f.Close()
	}
	in.f, in.gen, in.size = f, gen, 0
}

// prepared is a log file made ahead of its turn.
type prepared struct {
	f   *os.File
	err error
}

// prepareNext starts making the next generation's file while the current
// one still has room, so that the append that fills it does not wait for
// 8 MiB of zeros and their sync. Called with mu held.
func (in *intake) prepareNext() {
	if in.preparing {
		return
	}
	in.preparing = true
	gen := in.gen + 1
	go func() {
		f, err := in.makeFile(gen)
		in.nextFile <- prepared{f, err}
	}()
}

// rotate moves appends to the next generation's file: the one prepared
// ahead (waiting for it if it is still being made), else a new one. Called
// with mu held.
func (in *intake) rotate() error {
	if !in.preparing {
		return in.startFile(in.gen + 1)
	}
	p := <-in.nextFile
	in.preparing = false
	if p.err != nil {
		return p.err
	}
	in.use(p.f, in.gen+1)
	return nil
}

// makeFile creates generation gen's file, ready to append to. Under
// SyncFull the folder is synced, so that the new name is durable before a
// record in it is.
func (in *intake) makeFile(gen int64) (*os.File, error) {
	f, err := os.OpenFile(in.path(gen), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("storage: intake log: %w", err)
	}
	// The file is written full of zeros first, and synced: an append then
	// overwrites blocks the file system has already allocated, so its
	// fdatasync writes the data alone. Appending past the end would
	// change the file's size, and each sync would also commit the file
	// system's journal. A zero length ends the records.
	if err := prefill(f, intakeFileMax); err != nil {
		f.Close()
		return nil, err
	}
	// Held while appended to: a delete of every capture it names leaves
	// it be (removeUnheld).
	if err := holdSegment(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("storage: intake log: %w", err)
	}
	if in.sync {
		if err := syncDir(in.dir); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// prefill writes n zero bytes to f and syncs it.
func prefill(f *os.File, n int64) error {
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < n; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), n-off)], off); err != nil {
			return fmt.Errorf("storage: intake log: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("storage: intake log: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("storage: sync folder: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("storage: sync folder: %w", err)
	}
	return nil
}

// readLog reads the records of log file gen from offset start. cut is
// where a torn or damaged frame begins (-1: the file ends cleanly).
func readLog(path string, gen, start int64) (recs []logged, cut int64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, -1, fmt.Errorf("storage: read intake log: %w", err)
	}
	off := start
	for off < int64(len(data)) {
		if int64(len(data))-off < 8 {
			return recs, off, nil
		}
		n := int64(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		if n == 0 && sum == 0 {
			return recs, -1, nil // the zeros past the last record
		}
		if n == 0 || n > maxRecord || off+8+n > int64(len(data)) {
			return recs, off, nil
		}
		payload := data[off+8 : off+8+n]
		if crc32.Checksum(payload, castagnoli) != sum {
			return recs, off, nil
		}
		off += 8 + n
		recs = append(recs, logged{rec: payload, end: pos{gen, off}})
	}
	return recs, -1, nil
}

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
	written := make([]Written, len(inserts))
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil, errors.New("storage: the store is closed")
	}
	if in.size >= intakeFileMax/2 {
		in.prepareNext()
	}
	if in.size >= intakeFileMax*7/8 { // past the prefilled zeros would change the size at each sync
		if err := in.rotate(); err != nil {
			return nil, err
		}
	}
	// Large bodies first: each in its segment, synced once, before any
	// record names it.
	apart := false
	for _, c := range inserts {
		if !KeptApart(len(c.Body)) || db.bodies == nil {
			continue
		}
		apart = true
		if c.bodyFile == "" {
			name, off, err := db.bodies.append(c.Body)
			if err != nil {
				return nil, err
			}
			c.bodyFile, c.bodyOffset = name, off
		}
	}
	if apart && in.sync {
		if err := db.bodies.syncWritten(); err != nil {
			if errors.Is(err, errSegmentSync) {
				// Written again, to a new segment, should the caller try again.
				for _, c := range inserts {
					if KeptApart(len(c.Body)) {
						c.bodyFile, c.bodyOffset = "", 0
					}
				}
			}
			return nil, err
		}
	}
	start := len(in.pending)
	// rollback drops the records of this call from pending: they were
	// not written, or not synced.
	rollback := func() {
		for _, p := range in.pending[start:] {
			in.forget(p)
		}
		in.pending = in.pending[:start]
	}
	// One buffer for the call's frames; each pending record is a slice of
	// it, kept until applied (no copy per record).
	buf := make([]byte, 0, batchSize(inserts, updates))
	for i, c := range inserts {
		w := Written{ID: c.ID, DuplicateOf: c.DuplicateOf}
		if c.RelayID != "" && c.Queued {
			id, err := in.lookupRelay(ctx, c.RelayID)
			if err != nil {
				rollback()
				return nil, err
			}
			if id != "" {
				w.ID, w.Redelivered = id, true
				written[i] = w
				continue
			}
		}
		if c.DeliveryID != "" && w.DuplicateOf == "" {
			if w.DuplicateOf, err = in.lookupDelivery(ctx, c.DeliveryID); err != nil {
				rollback()
				return nil, err
			}
		}
		written[i] = w
		var rec []byte
		buf, rec = appendFrame(buf, func(b []byte) []byte { return encodeInsert(b, c, w.DuplicateOf) })
		in.pending = append(in.pending, logged{rec: rec, end: pos{in.gen, in.size + int64(len(buf))},
			deliveryID: c.DeliveryID, relayID: queuedRelayID(c), id: c.ID})
		if c.DeliveryID != "" {
			if _, ok := in.byDeliver[c.DeliveryID]; !ok {
				in.byDeliver[c.DeliveryID] = c.ID
			}
			if in.ids != nil {
				in.ids.add(c.DeliveryID)
			}
		}
		if r := queuedRelayID(c); r != "" {
			in.byRelay[r] = c.ID
		}
	}
	for _, c := range updates {
		var rec []byte
		buf, rec = appendFrame(buf, func(b []byte) []byte { return encodeUpdate(b, c) })
		in.pending = append(in.pending, logged{rec: rec, end: pos{in.gen, in.size + int64(len(buf))}})
	}
	if len(buf) == 0 {
		return written, nil
	}
	fail := func(err error) ([]Written, error) {
		rollback()
		// Nothing past the last good frame stays: it is zeroed again.
		// Should that fail too, the next append starts a new file.
		if _, zerr := in.f.WriteAt(make([]byte, len(buf)), in.size); zerr != nil {
			in.size = intakeFileMax
		}
		return nil, err
	}
	if _, err := in.writeAt(in.f, buf, in.size); err != nil {
		return fail(fmt.Errorf("storage: append to the intake log: %w", err))
	}
	if in.sync && len(inserts) > 0 {
		if err := syscall.Fdatasync(int(in.f.Fd())); err != nil {
			// After a failed sync the file's pages are in a state no
			// later sync reports truly: the next append starts a new file.
			written, err := fail(fmt.Errorf("storage: sync the intake log: %w", err))
			in.size = intakeFileMax
			return written, err
		}
	}
	in.size += int64(len(buf))
	if db.index != nil && len(inserts) > 0 {
		db.index.touch()
	}
	in.npending.Store(int64(len(in.pending)))
	select {
	case in.wake <- struct{}{}:
	default:
	}
	return written, nil
}

// queuedRelayID is the relay id a redelivery of c would be found by.
func queuedRelayID(c *Capture) string {
	if c.Queued {
		return c.RelayID
	}
	return ""
}

// forget drops the look-up entries of p. Called with mu held.
func (in *intake) forget(p logged) {
	if p.deliveryID != "" && in.byDeliver[p.deliveryID] == p.id {
		delete(in.byDeliver, p.deliveryID)
	}
	if p.relayID != "" && in.byRelay[p.relayID] == p.id {
		delete(in.byRelay, p.relayID)
	}
}

// lookupDelivery returns the first capture with delivery id d: pending,
// or in the store. A record leaves pending only after its commit, so it is
// always in one or the other. Called with mu held.
func (in *intake) lookupDelivery(ctx context.Context, d string) (string, error) {
	if id, ok := in.byDeliver[d]; ok {
		return id, nil
	}
	if in.ids != nil && !in.ids.mayHave(d) {
		return "", nil // never seen
	}
	in.sqlChecks++
	var id string
	err := in.db.read.QueryRowContext(ctx, `SELECT id FROM captures WHERE delivery_id = ? ORDER BY seq LIMIT 1`, d).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("storage: look up delivery id: %w", err)
	}
	return id, nil
}

// lookupRelay returns the queued capture with relay id r. Called with mu
// held.
func (in *intake) lookupRelay(ctx context.Context, r string) (string, error) {
	if id, ok := in.byRelay[r]; ok {
		return id, nil
	}
	var id string
	err := in.db.read.QueryRowContext(ctx, qSelRelayID, r).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("storage: look up relay id: %w", err)
	}
	return id, nil
}

const qSelRelayID = `SELECT id FROM captures WHERE relay_id = ? AND queued = 1`

// applyLoop applies pending records: applyDelay after the first of a
// quiet spell, or at once when applyBatch are waiting.
func (in *intake) applyLoop() {
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
			timer.Reset(applyDelay)
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
func (in *intake) catchUp(ctx context.Context) error {
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
func (in *intake) apply(ctx context.Context, batch []logged) error {
	db := in.db
	if db.index != nil {
		if err := db.index.waitRoom(ctx, len(batch)); err != nil {
			return err
		}
	}
	var last int64
	end := batch[len(batch)-1].end
	// Not synced: the log holds these records, synced, until a
	// checkpoint has made this commit durable (below).
	err := db.writeRawDurable(ctx, false, func(w *rawConn) error {
		for _, p := range batch {
			kind, c, bodyAt, err := decodeRecord(p.rec)
			if err != nil {
				return fmt.Errorf("storage: intake record before %d in log %d: %w", p.end.off, p.end.gen, err)
			}
			switch kind {
			case recInsert:
				if len(c.Body) > 0 {
					// The body stays in the log, where the store finds it.
					c.bodyFile, c.bodyOffset = logName(p.end.gen), p.end.off-int64(len(p.rec))+int64(bodyAt)
					c.Size, c.Body = len(c.Body), nil
				}
				wr, err := w.insertLogged(c)
				if err != nil {
					return err
				}
				last = max(last, wr.Seq)
			case recUpdate:
				if err := w.updateCapture(c); err != nil {
					return err
				}
			}
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
		db.index.saved(last)
	}
	return nil
}

// dropApplied deletes the applied logs of gens that no capture names, once
// the commits that applied them are on disk (a commit at
// synchronous=NORMAL is not until the WAL is synced).
func (in *intake) dropApplied(gens []int64) error {
	if len(gens) == 0 {
		return nil
	}
	if err := in.db.syncWAL(); err != nil {
		return err
	}
	for _, g := range gens {
		if err := in.db.removeSegmentIfUnused(logName(g)); err != nil {
			return fmt.Errorf("storage: remove an applied intake log: %w", err)
		}
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

// insertLogged inserts a capture decoded from the log: its duplicate was
// looked up when it was logged, and a redelivery was never logged.
func (w *rawConn) insertLogged(c *Capture) (Written, error) {
	return w.insert(c, Written{ID: c.ID, DuplicateOf: c.DuplicateOf})
}

// close stops applyLoop, applies what is pending, and closes the files.
func (in *intake) close() error {
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
	if in.preparing {
		// Made ahead and never used: an empty log, which the next open
		// finds empty and deletes.
		if p := <-in.nextFile; p.f != nil {
			p.f.Close()
		}
		in.preparing = false
	}
	if in.f != nil {
		err = errors.Join(err, in.f.Close())
	}
	return errors.Join(err, in.lock.Close())
}

// caughtUp applies, before a read or a direct write, every record logged
// before it.
func (db *AgentStore) caughtUp(ctx context.Context) error {
	if db.intake == nil {
		return nil
	}
	return db.intake.catchUp(ctx)
}

// appendFrame appends to b a frame whose payload encode appends, and
// returns b and the payload (a slice of b).
func appendFrame(b []byte, encode func([]byte) []byte) (_, payload []byte) {
	at := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = encode(b)
	payload = b[at+8:]
	binary.LittleEndian.PutUint32(b[at:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[at+4:], crc32.Checksum(payload, castagnoli))
	return b, payload
}

// batchSize is about the bytes of the frames of inserts and updates.
func batchSize(inserts, updates []*Capture) int {
	n := 0
	for _, c := range inserts {
		n += 512 + len(c.RequestHeaders) + len(c.Path) + len(c.Query)
		if !KeptApart(len(c.Body)) {
			n += len(c.Body)
		}
	}
	for _, c := range updates {
		n += 256 + len(c.ResponseHeaders) + len(c.ResponseBody) + len(c.Error)
	}
	return n
}

// recEncoder writes a record's fields: strings and bytes length-prefixed,
// numbers as varints.
type recEncoder struct{ b []byte }

func (e *recEncoder) str(s string) {
	e.b = binary.AppendUvarint(e.b, uint64(len(s)))
	e.b = append(e.b, s...)
}
func (e *recEncoder) bytes(p []byte) {
	e.b = binary.AppendUvarint(e.b, uint64(len(p)))
	e.b = append(e.b, p...)
}
func (e *recEncoder) int(n int64) { e.b = binary.AppendVarint(e.b, n) }
func (e *recEncoder) bool(v bool) { e.b = append(e.b, boolByte(v)) }
func (e *recEncoder) time(t time.Time) {
	if t.IsZero() {
		e.int(0)
		return
	}
	e.int(t.UnixMicro())
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// encodeInsert appends to b the record of a new capture, dup its duplicate.
func encodeInsert(b []byte, c *Capture, dup string) []byte {
	e := recEncoder{b: b}
	e.b = append(e.b, recInsert)
	e.str(c.ID)
	e.str(c.RelayID)
	e.str(c.Source)
	e.time(c.CreatedAt)
	e.time(c.ArrivedAt)
	e.bool(c.Queued)
	e.str(c.Method)
	e.str(c.Path)
	e.str(c.Query)
	e.str(c.RequestHeaders)
	e.int(int64(len(c.Body)))
	e.str(c.bodyFile)
	e.int(c.bodyOffset)
	if c.bodyFile == "" {
		e.bytes(c.Body)
	}
	e.str(c.Target)
	e.str(c.Event)
	e.str(c.CallID)
	e.str(c.DeliveryID)
	e.str(c.OccurredAt)
	e.str(dup)
	e.str(c.ReplayOf)
	e.str(c.Status)
	e.int(int64(c.MaxAttempts))
	return e.b
}

// encodeUpdate appends to b the record of a capture's response
// (updateCapture).
func encodeUpdate(b []byte, c *Capture) []byte {
	e := recEncoder{b: b}
	e.b = append(e.b, recUpdate)
	e.str(c.ID)
	e.str(c.Status)
	e.int(int64(c.ResponseStatus))
	e.str(c.ResponseHeaders)
	e.bool(c.ResponseBody != nil)
	e.bytes(c.ResponseBody)
	e.str(c.Error)
	e.int(int64(c.Duration))
	e.time(c.DeliveredAt)
	e.int(int64(c.Attempts))
	e.int(int64(c.MaxAttempts))
	e.str(c.Target)
	e.bool(c.Queued)
	e.time(c.ArrivedAt)
	e.bool(c.LastAttempt != nil)
	if a := c.LastAttempt; a != nil {
		e.int(int64(a.N))
		e.time(a.At)
		e.int(int64(a.ResponseStatus))
		e.str(a.Error)
		e.int(int64(a.Duration))
	}
	return e.b
}

// recDecoder reads what recEncoder wrote; the first error sticks.
type recDecoder struct {
	b   []byte
	err error
}

var errRecord = errors.New("malformed record")

func (d *recDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errRecord
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *recDecoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errRecord
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *recDecoder) str() string { return string(d.bytes()) }

// int reads what binary.AppendVarint wrote: a zigzag-encoded uvarint.
func (d *recDecoder) int() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (d *recDecoder) bool() bool {
	if d.err != nil || len(d.b) == 0 {
		d.err = errRecord
		return false
	}
	v := d.b[0] == 1
	d.b = d.b[1:]
	return v
}

func (d *recDecoder) time() time.Time {
	us := d.int()
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}

// decodeRecord reads a record's kind and capture, and where in rec an
// insert's inline body begins.
func decodeRecord(rec []byte) (kind byte, c *Capture, bodyAt int, err error) {
	if len(rec) == 0 {
		return 0, nil, 0, errRecord
	}
	d := recDecoder{b: rec[1:]}
	c = &Capture{}
	switch rec[0] {
	case recInsert:
		c.ID = d.str()
		c.RelayID = d.str()
		c.Source = d.str()
		c.CreatedAt = d.time()
		c.ArrivedAt = d.time()
		c.Queued = d.bool()
		c.Method = d.str()
		c.Path = d.str()
		c.Query = d.str()
		c.RequestHeaders = d.str()
		c.Size = int(d.int())
		c.bodyFile = d.str()
		c.bodyOffset = d.int()
		if c.bodyFile == "" {
			c.Body = d.bytes()
			bodyAt = len(rec) - len(d.b) - len(c.Body)
		}
		c.Target = d.str()
		c.Event = d.str()
		c.CallID = d.str()
		c.DeliveryID = d.str()
		c.OccurredAt = d.str()
		c.DuplicateOf = d.str()
		c.ReplayOf = d.str()
		c.Status = d.str()
		c.MaxAttempts = int(d.int())
	case recUpdate:
		c.ID = d.str()
		c.Status = d.str()
		c.ResponseStatus = int(d.int())
		c.ResponseHeaders = d.str()
		hasBody := d.bool()
		body := d.bytes()
		if hasBody {
			c.ResponseBody = body
		}
		c.Error = d.str()
		c.Duration = time.Duration(d.int())
		c.DeliveredAt = d.time()
		c.Attempts = int(d.int())
		c.MaxAttempts = int(d.int())
		c.Target = d.str()
		c.Queued = d.bool()
		c.ArrivedAt = d.time()
		if d.bool() {
			c.LastAttempt = &Attempt{N: int(d.int()), At: d.time(), ResponseStatus: int(d.int()), Error: d.str(), Duration: time.Duration(d.int())}
		}
	default:
		return 0, nil, 0, errRecord
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = errRecord
	}
	if d.err != nil {
		return 0, nil, 0, d.err
	}
	return rec[0], c, bodyAt, nil
}
