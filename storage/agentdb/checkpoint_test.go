package agentdb

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The background checkpoint asks the writer to checkpoint itself once the
// WAL holds more than walBound bytes, and only then.
func TestCheckpointAsksTheWriterPastTheBound(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	for i := range 5 { // five commits: frames in the WAL
		saveCaptures(t, db, testCapture(i, []byte(`{"n":1}`)))
	}
	// A checkpointer of the test's own, never kicked: its loop leaves it
	// alone, so the test may set its page size.
	c, err := startCheckpointer(ctx, db.sdb.Pool("immediate", false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if err := c.checkpoint(); err != nil {
		t.Fatal(err)
	}
	if c.needSync.Load() {
		t.Fatalf("a WAL of a few pages of %d bytes asked the writer to checkpoint", c.pageSize)
	}
	// Pages of walBound bytes: two frames pass the bound. A checkpoint that
	// meets the store's own background one under way reads no frame count
	// (SQLite answers busy, -1): it is tried again, within a deadline.
	c.pageSize = walBound
	for deadline := time.Now().Add(10 * time.Second); !c.needSync.Load(); {
		if err := c.checkpoint(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("a WAL past walBound did not ask the writer to checkpoint")
		}
	}
}

// Asked to, the writer checkpoints after its next commit, and the request
// is taken.
func TestWriterCheckpointsWhenAsked(t *testing.T) {
	db := openAgentDB(t)
	saveCaptures(t, db, testCapture(1, []byte(`{"n":1}`)))
	db.ckpt.needSync.Store(true)
	saveCaptures(t, db, testCapture(2, []byte(`{"n":2}`)))
	if db.ckpt.needSync.Load() {
		t.Fatal("the writer committed and left the checkpoint it was asked for")
	}
}

// A WAL of exactly walBound bytes is within the bound: the writer is not
// asked to checkpoint.
func TestCheckpointAtTheBoundLeavesTheWriter(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	c, err := startCheckpointer(ctx, db.sdb.Pool("immediate", false))
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	// Start the WAL over, then one commit of one page (the header's
	// user_version, which the agent's store does not use): one frame.
	var busy, frames, done int64
	if err := c.db.QueryRow(`PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &frames, &done); err != nil || busy != 0 {
		t.Fatalf("truncating the WAL: busy %d, %v", busy, err)
	}
	if _, err := c.db.Exec(`PRAGMA user_version = 7`); err != nil {
		t.Fatal(err)
	}
	if err := c.db.QueryRow(`PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &done); err != nil || frames != 1 {
		t.Fatalf("the WAL holds %d frames (%v), want 1", frames, err)
	}
	c.pageSize = walBound // one frame: exactly walBound bytes
	if err := c.checkpoint(); err != nil {
		t.Fatal(err)
	}
	if c.needSync.Load() {
		t.Fatal("a WAL of exactly walBound bytes asked the writer to checkpoint")
	}
}

// Background checkpoints keep their pace: the one after a commit runs at
// once, the next no sooner than checkpointEvery after it, however soon the
// next commit comes; and a checkpoint that worked logs nothing.
func TestBackgroundCheckpointPace(t *testing.T) {
	ctx := context.Background()
	logs := captureLog(t)
	path := filepath.Join(t.TempDir(), "agent.db")
	db, err := OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Only a checkpoint writes to the database file (the writer's
	// autocheckpoint is off), and it copies pages in order: the file
	// reaches the size the store has after a commit once a checkpoint
	// has copied that commit.
	var pageSize int64
	if err := db.read.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	storeSize := func() int64 {
		t.Helper()
		var pages int64
		if err := db.read.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
			t.Fatal(err)
		}
		return pages * pageSize
	}
	reaches := func(size int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() >= size {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the database file stayed at %d bytes, want %d: no background checkpoint", fi.Size(), size)
			}
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// Commits until the store outgrows the file: the file reaches that
	// size only by a checkpoint of them (not, say, by pages a vacuum at
	// Open freed in the WAL but not yet in the file).
	body := bytes.Repeat([]byte("x"), 64<<10) // in the database: new pages
	start := time.Now()
	n, first := 0, int64(0)
	for first <= fi.Size() {
		n++
		saveCaptures(t, db, testCapture(n, body))
		first = storeSize()
	}
	reaches(first)
	saveCaptures(t, db, testCapture(n+1, body))
	second := storeSize()
	if second <= first {
		t.Fatalf("the second commit did not grow the store (%d bytes, then %d)", first, second)
	}
	reaches(second)
	if took := time.Since(start); took < checkpointEvery {
		t.Errorf("a second background checkpoint %v after the first commit, want no sooner than %v", took, checkpointEvery)
	}
	if err := db.Close(); err != nil { // the checkpointer has stopped: what it logged is all there
		t.Fatal(err)
	}
	if got := logs.lines("background checkpoint"); len(got) > 0 {
		t.Errorf("checkpoints that worked logged %q", got)
	}
}
