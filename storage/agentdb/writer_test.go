package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The writer prepares its statements once per connection: a second batch
// on the same connection finds them ready.
func TestWriterKeepsItsStatements(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var first, second *rawConn
	for i, w := range []**rawConn{&first, &second} {
		if err := db.writeRaw(ctx, func(rc *rawConn) error {
			*w = rc
			_, err := rc.insertCapture(testCapture(i, []byte(`{}`)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if first != second || len(second.stmts) == 0 {
		t.Fatalf("the second batch ran on writer state %p (%d statements), the first on %p", second, len(second.stmts), first)
	}
}

// A write whose context ends while it waits for the database's write lock
// is rolled back: it returns the context's error alone, saves nothing,
// and the next write goes through.
func TestCanceledWriteRollsBack(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openAgentAt(t, path)
	other, err := sql.Open("sqlite3", "file:"+path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lock, err := other.Begin() // the write lock, until Rollback
	if err != nil {
		t.Fatal(err)
	}
	writeCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	wrote := make(chan error, 1)
	go func() {
		_, err := db.WriteCaptures(writeCtx, []*Capture{testCapture(1, []byte(`{"n":1}`))}, nil)
		wrote <- err
	}()
	// The writer holds its gate once it is on its way to the lock.
	for deadline := time.Now().Add(10 * time.Second); db.writeGate.TryLock(); time.Sleep(time.Millisecond) {
		db.writeGate.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the write never began")
		}
	}
	cancel()
	lock.Rollback()
	if err := <-wrote; !errors.Is(err, context.Canceled) || err.Error() != context.Canceled.Error() {
		t.Fatalf("a write canceled while it waited: %q, want the cancellation alone", err)
	}
	if n := countCaptures(t, db); n != 0 {
		t.Fatalf("%d captures saved by the canceled write", n)
	}
	saveCaptures(t, db, testCapture(2, []byte(`{"n":2}`)))
}

// The writer's one-row query reports a row it cannot scan as asked (too
// few columns, a destination it does not fill) rather than "no row".
func TestWriterQueryRowReportsWhatItCannotScan(t *testing.T) {
	db := openAgentDB(t)
	var n, m int64
	var f float64
	for _, tc := range []struct {
		dest []any
		want string
	}{
		{[]any{&n, &m}, "1 columns for 2 destinations"},
		{[]any{&f}, "cannot scan into *float64"},
	} {
		err := db.writeRaw(context.Background(), func(w *rawConn) error {
			ok, err := w.queryRow(`SELECT 1`, nil, tc.dest...)
			if ok {
				t.Errorf("%s: a row scanned", tc.want)
			}
			return err
		})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("a row it cannot scan: %v, want %q", err, tc.want)
		}
	}
}
