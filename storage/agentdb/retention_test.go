package agentdb

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/intake"
)

// lockedBuffer is a log destination safe for the goroutine that writes
// and the test that reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// RunRetention prunes at once, then every interval, and says what it
// pruned; a new capture too old by the next pass goes then. With no
// limit it returns at once.
func TestRunRetentionPrunesEveryInterval(t *testing.T) {
	db := openAgentDB(t)
	saveCaptures(t, db, testCapture(1, []byte(`{"n":1}`)), testCapture(2, []byte(`{"n":2}`)))
	var logged lockedBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		db.RunRetention(ctx, Retention{MaxAge: time.Hour, Pause: time.Millisecond}, 10*time.Millisecond, log)
	}()
	// The deadlines bound a hang; each pass takes milliseconds.
	waitCaptures := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); countCaptures(t, db) != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d captures 20 s on, want %d: retention did not prune", countCaptures(t, db), want)
			}
		}
	}
	waitCaptures(0)
	saveCaptures(t, db, testCapture(3, []byte(`{"n":3}`)))
	waitCaptures(0)
	cancel()
	<-done
	// Two passes pruned, and said so; the others, with nothing to prune,
	// said nothing.
	out := logged.String()
	if !strings.Contains(out, `msg="retention: pruned old captures" captures=2 media=0`) ||
		!strings.Contains(out, `msg="retention: pruned old captures" captures=1 media=0`) ||
		strings.Count(out, "\n") != 2 {
		t.Errorf("the log says %q, want the two passes that pruned", out)
	}

	// No limit: nothing to do, and it returns.
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db.RunRetention(ctx, Retention{}, time.Millisecond, log)
	if ctx.Err() != nil {
		t.Error("RunRetention without a limit ran until its context ended")
	}
}

// Prune pauses between two batches of deletions: for Pause, or 5 ms when
// none is given. (The pauses are a least time; the deletions add theirs.)
func TestPrunePausesBetweenBatches(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		batches int
		pause   time.Duration // Retention.Pause
		least   time.Duration // what the pauses take
	}{
		{batches: 3, pause: 150 * time.Millisecond, least: 2 * 150 * time.Millisecond},
		{batches: 41, pause: 0, least: 40 * 5 * time.Millisecond},
	}
	for _, tc := range cases {
		db := openAgentAt(t, filepath.Join(t.TempDir(), "agent.db"), WithSync(storage.SyncNormal))
		n := (tc.batches-1)*deleteBatchMax + 1
		cs := make([]*Capture, n)
		for i := range cs {
			cs[i] = testCapture(i, []byte(`{}`))
		}
		saveCaptures(t, db, cs...)
		start := time.Now()
		d, err := db.Prune(ctx, Retention{MaxAge: time.Hour, Pause: tc.pause}, cs[n-1].CreatedAt.Add(2*time.Hour))
		took := time.Since(start)
		if err != nil || d.Captures != n {
			t.Fatalf("pause %v: pruned %d (%v), want %d", tc.pause, d.Captures, err, n)
		}
		if took < tc.least {
			t.Errorf("pause %v: %d batches pruned in %v, want the pauses between them to take %v", tc.pause, tc.batches, took, tc.least)
		}
	}
}

// Pruning for size measures again after each round: where the first
// round's estimate (bodies and rowOverhead each) freed less than the
// excess, the next round takes what is left, and the store ends under
// the limit, the oldest gone first.
func TestPruneToMaxBytesInRounds(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	// The oldest are small: each frees less than rowOverhead on disk.
	const small, large = 20, 12
	var cs []*Capture
	for i := range small + large {
		body := []byte(`{}`)
		if i >= small {
			body = bytes.Repeat([]byte{0xff, byte(i)}, intake.BodyMin/2) // not UTF-8: not indexed
		}
		cs = append(cs, testCapture(i, body))
	}
	saveCaptures(t, db, cs...)
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	// A prune under no real limit hands back what the writes left (WAL,
	// free pages): the size measured next is the one Prune starts from.
	if _, err := db.Prune(ctx, Retention{MaxBytes: 1 << 40}, time.Now()); err != nil {
		t.Fatal(err)
	}
	used, err := db.DiskUsage()
	if err != nil {
		t.Fatal(err)
	}
	// An excess the estimate of the small ones and 4 large ones just
	// covers: the first round deletes those, and frees less.
	limit := used - (small*(2+rowOverhead) + 4*(intake.BodyMin+rowOverhead) - 1000)
	d, err := db.Prune(ctx, Retention{MaxBytes: limit}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if after, err := db.DiskUsage(); err != nil || after > limit {
		t.Fatalf("pruned %d captures: usage %d (%v), over the limit %d", d.Captures, after, err, limit)
	}
	for i, c := range cs {
		_, err := db.Capture(ctx, c.ID)
		if gone := i < d.Captures; gone != errors.Is(err, ErrNotFound) {
			t.Fatalf("pruned %d: capture %d: %v", d.Captures, i, err)
		}
	}
}

// Pruning for size deletes what its estimate says covers the excess, not
// one more: a store a few small captures over its limit keeps the others.
func TestPruneToMaxBytesKeepsTheRest(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	const n = 200
	var cs []*Capture
	for i := range n {
		cs = append(cs, testCapture(i, []byte(`{}`)))
	}
	saveCaptures(t, db, cs...)
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Prune(ctx, Retention{MaxBytes: 1 << 40}, time.Now()); err != nil { // see TestPruneToMaxBytesInRounds
		t.Fatal(err)
	}
	used, err := db.DiskUsage()
	if err != nil {
		t.Fatal(err)
	}
	// An excess of exactly the estimate of 10 (2 bytes of body and
	// rowOverhead each): those 10 cover it. (Deleting them frees no
	// whole page: the next round measures no gain and stops.)
	d, err := db.Prune(ctx, Retention{MaxBytes: used - 10*(2+rowOverhead)}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if d.Captures != 10 {
		t.Fatalf("a store 10 small captures over its limit: pruned %d of %d, want 10", d.Captures, n)
	}
}

// RunRetention's passes that prune nothing log nothing; the one that
// prunes says what.
func TestRunRetentionQuietWhenNothingGoes(t *testing.T) {
	db := openAgentDB(t)
	const age = time.Hour
	const ripens = 300 * time.Millisecond // the capture is too old from then on: passes before find nothing
	c := testCapture(1, []byte(`{"n":1}`))
	c.CreatedAt = time.Now().Add(-age + ripens)
	saveCaptures(t, db, c)
	var logged lockedBuffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		db.RunRetention(ctx, Retention{MaxAge: age, Pause: time.Millisecond}, 5*time.Millisecond, log)
	}()
	for deadline := time.Now().Add(20 * time.Second); countCaptures(t, db) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) { // bounds a hang
			t.Fatal("the capture was not pruned 20 s on")
		}
	}
	cancel()
	<-done
	lines := strings.Split(strings.TrimSuffix(logged.String(), "\n"), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `msg="retention: pruned old captures" captures=1 media=0`) {
		t.Errorf("the log has %d lines, the first %q; want only the pass that pruned", len(lines), lines[0])
	}
}

// A vacuum hands back the search index's pages beside the capture writer
// (the index is not the writer's), and the store's only between the
// writer's transactions: while the writer holds its gate, the index's WAL
// is truncated and the vacuum waits for the gate to finish the store.
func TestVacuumWaitsForTheWriterOnlyForTheStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openAgentAt(t, path)
	saveCaptures(t, db, testCapture(1, []byte(`{"city":"Denver"}`)), testCapture(2, []byte(`{"city":"Austin"}`)))
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	indexWAL := SearchIndexPath(path) + "-wal"
	if fi, err := os.Stat(indexWAL); err != nil || fi.Size() == 0 {
		t.Fatalf("the index's WAL before the vacuum: %v, %v; the test needs one", fi, err)
	}
	db.writeGate.Lock() // the capture writer, mid-transaction
	locked := true
	defer func() {
		if locked {
			db.writeGate.Unlock()
		}
	}()
	done := make(chan error, 1)
	go func() { done <- db.vacuum(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		fi, err := os.Stat(indexWAL)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() == 0 {
			break
		}
		if time.Now().After(deadline) { // bounds a hang
			t.Fatal("the index's WAL was not truncated while the writer held its gate")
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the vacuum finished (%v) while the writer held its gate", err)
	default:
	}
	db.writeGate.Unlock()
	locked = false
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A vacuum truncates the store's WAL once a reader in its way is done,
// trying for a while; a reader that stays is left alone: the vacuum gives
// up and returns (the next prune tries again).
func TestVacuumTriesTheWALForAWhile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openAgentAt(t, path)
	saveCaptures(t, db, testCapture(1, []byte(`{"n":1}`)))
	// Each try waits 20 ms for the reader, not busyTimeout.
	if _, err := db.index.DB().ExecContext(ctx, `PRAGMA busy_timeout = 20`); err != nil {
		t.Fatal(err)
	}
	reader, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	hold := func() *sql.Tx { // a reader's snapshot, in the WAL
		t.Helper()
		tx, err := reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(`SELECT count(*) FROM captures`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	done := make(chan error, 1)

	// A reader that stays, its snapshot older than the last commit: the
	// WAL cannot all be copied back, nor start over.
	tx := hold()
	saveCaptures(t, db, testCapture(2, []byte(`{"n":2}`)))
	go func() { done <- db.vacuum(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second): // bounds a hang
		tx.Rollback()
		t.Fatal("the vacuum kept waiting for a reader that stayed")
	}
	tx.Rollback()

	// A reader done a little later (the store's WAL alone: the index's
	// goes first in a vacuum, and takes its own time).
	tx = hold()
	saveCaptures(t, db, testCapture(3, []byte(`{"n":3}`)))
	conn, err := db.index.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	go func() { done <- truncateWAL(ctx, conn, "main") }()
	time.Sleep(100 * time.Millisecond) // the reader in the way for a while
	tx.Rollback()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 0 {
		t.Fatalf("the store's WAL after the reader was done: %d bytes, want it truncated", fi.Size())
	}
}
