package agentdb

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/agentdb/searchindex"
)

// indexedUpto is the search index's position in the store at path, read
// by a reader (no indexer of its own).
func indexedUpto(t *testing.T, path string) int64 {
	t.Helper()
	r, err := OpenAgentReader(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var upto int64
	if err := r.read.QueryRow(`SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil {
		t.Fatal(err)
	}
	return upto
}

// Closing the store does not wait for a backlog to be indexed: the
// indexer stops after the chunk under way, and the next start indexes the
// rest. (An agent stopped by SIGTERM with thousands of large bodies not yet
// indexed went on indexing every one of them for minutes before it
// exited.)
func TestCloseLeavesTheBacklogForTheNextStart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db, err := OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	n := 20 * searchindex.Chunk
	batch := make([]*Capture, 0, searchindex.Chunk)
	for i := 1; i <= n; i++ {
		batch = append(batch, testCapture(i, fmt.Appendf(nil, `{"n":%d,"city":"Austin"}`, i)))
		if len(batch) == searchindex.Chunk {
			saveCaptures(t, db, batch...)
			batch = batch[:0]
		}
	}
	// Once the writer is idle (searchIdle), the indexer takes the backlog
	// chunk after chunk. Close once the first chunk is in.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Millisecond) {
		var upto int64
		if err := db.read.QueryRow(`SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil {
			t.Fatal(err)
		}
		if upto > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the indexer never indexed its first chunk")
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if upto := indexedUpto(t, path); upto >= int64(n) {
		t.Fatalf("Close returned with the whole backlog of %d indexed: it waited for the indexer to finish it", n)
	}

	again, err := OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		var upto int64
		if err := again.read.QueryRow(`SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil {
			t.Fatal(err)
		}
		if upto == int64(n) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the next start left the backlog at %d of %d", upto, n)
		}
	}
	if _, count, err := again.Captures(ctx, CaptureFilter{Text: "Austin", Page: Page{Limit: 1}}); err != nil || count != n {
		t.Errorf("search after the restart: %d captures (%v), want %d", count, err, n)
	}
}
