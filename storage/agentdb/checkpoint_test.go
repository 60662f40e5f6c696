package agentdb

import (
	"context"
	"testing"
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
	// Pages of walBound bytes: two frames pass the bound.
	c.pageSize = walBound
	if err := c.checkpoint(); err != nil {
		t.Fatal(err)
	}
	if !c.needSync.Load() {
		t.Fatal("a WAL past walBound did not ask the writer to checkpoint")
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
