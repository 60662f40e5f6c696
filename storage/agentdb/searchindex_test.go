package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/agentdb/searchindex"
)

func searchIDs(t *testing.T, db *AgentStore, text string) []string {
	t.Helper()
	rows, count, err := db.Captures(context.Background(), CaptureFilter{Text: text, Page: Page{Limit: 50}})
	if err != nil {
		t.Fatal(err)
	}
	if count != len(rows) {
		t.Fatalf("search %q: count %d for %d rows", text, count, len(rows))
	}
	return ids(rows)
}

// idleForever keeps a store's background indexer from indexing a backlog
// within its bound, so that a test sees the backlog it left.
var idleForever = withPace(func(p *searchindex.Pace) { p.Idle = time.Hour })

// A capture is found by text search as soon as it is saved, though the
// full-text index takes it later; indexing then leaves no backlog and the
// same answers.
func TestSearchSeesCapturesNotYetIndexed(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t, idleForever)
	var cs []*Capture
	for i := range 10 {
		cs = append(cs, testCapture(i, fmt.Appendf(nil, `{"city":"Denver","lead_id":"L-%d"}`, i)))
	}
	if _, err := db.WriteCaptures(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	if n := db.SearchBacklog(); n != 10 {
		t.Fatalf("backlog after saving 10: %d", n)
	}
	if got := searchIDs(t, db, "L-7"); len(got) != 1 || got[0] != cs[7].ID {
		t.Fatalf("search L-7 before indexing: %v", got)
	}
	if n := db.SearchBacklog(); n != 0 {
		t.Errorf("a search leaves a backlog of %d", n)
	}
	more := testCapture(10, []byte(`{"city":"Boston"}`))
	if _, err := db.WriteCaptures(ctx, []*Capture{more}, nil); err != nil {
		t.Fatal(err)
	}
	if left, err := db.IndexSearch(ctx, 100); err != nil || left != 0 {
		t.Fatalf("IndexSearch: %d left, %v", left, err)
	}
	if got := searchIDs(t, db, "Boston"); len(got) != 1 || got[0] != more.ID {
		t.Errorf("search Boston after indexing: %v", got)
	}
	if got := searchIDs(t, db, "Denver"); len(got) != 10 {
		t.Errorf("search Denver: %d matches, want 10", len(got))
	}
}

// Left alone, the background indexer takes a backlog once writes stop.
func TestSearchIndexedWhenIdle(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	if _, err := db.WriteCaptures(ctx, []*Capture{testCapture(1, []byte(`{"city":"Austin"}`))}, nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); db.SearchBacklog() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) { // bounds a hang
			t.Fatalf("backlog still %d after a minute of no writes", db.SearchBacklog())
		}
	}
	var upto int64
	if err := db.read.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil || upto != 1 {
		t.Fatalf("indexed up to %d, %v", upto, err)
	}
}

// openAgentAt opens the agent store at path; the test's end closes it.
func openAgentAt(t *testing.T, path string, opts ...Option) *AgentStore {
	t.Helper()
	db, err := OpenAgent(context.Background(), path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// lockSearchIndex holds the write lock of the index file of the store at
// path from a connection of its own, so that no indexer makes progress,
// until unlock is called (or the test ends).
func lockSearchIndex(t *testing.T, path string) (unlock func()) {
	t.Helper()
	lock, err := sql.Open("sqlite3", "file:"+SearchIndexPath(path)+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	tx, err := lock.Begin()
	if err != nil {
		t.Fatal(err)
	}
	return func() { tx.Rollback() }
}

// Beyond the bound, the indexer works beside the writer, and a writer that
// outruns it by more than searchindex.DefaultLead waits for it: here the index file is
// locked by another connection until the second write has begun, so that
// write can only leave the backlog within bound+searchindex.DefaultLead(+1) by waiting.
func TestSearchBacklogIsBounded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openAgentAt(t, path, WithSearchBacklogMax(0))
	unlock := lockSearchIndex(t, path)
	var first []*Capture
	for i := range searchindex.DefaultLead + 100 {
		first = append(first, testCapture(i, []byte(`{"city":"Austin"}`)))
	}
	if _, err := db.WriteCaptures(ctx, first, nil); err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := db.WriteCaptures(ctx, []*Capture{testCapture(searchindex.DefaultLead+100, []byte(`{"city":"Austin"}`))}, nil)
		wrote <- err
	}()
	unlock() // the indexer goes on
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if n := db.SearchBacklog(); n > searchindex.DefaultLead+1 {
		t.Fatalf("the second write left a backlog of %d, bound 0 + %d", n, searchindex.DefaultLead)
	}
	if _, n, err := db.Captures(ctx, CaptureFilter{Text: "Austin", Page: Page{Limit: 1}}); err != nil || n != searchindex.DefaultLead+101 {
		t.Errorf("search count %d, %v; want %d", n, err, searchindex.DefaultLead+101)
	}
}

// The position survives a restart: a new process indexes what an old one
// saved and never indexed.
func TestSearchBacklogSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db, err := OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.WriteCaptures(ctx, []*Capture{testCapture(1, []byte(`{"city":"Seattle"}`))}, nil); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err = OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := searchIDs(t, db, "Seattle"); len(got) != 1 {
		t.Errorf("search after reopening: %v", got)
	}
}

// Two processes on one store (calltap backfill beside calltap listen): one
// indexing what the other saved must not make either index a capture twice
// or miss one.
func TestSearchIndexWithTwoWriters(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	a := openAgentAt(t, path, WithSearchBacklogMax(3))
	b := openAgentAt(t, path)
	write := func(db *AgentStore, n int) {
		t.Helper()
		if _, err := db.WriteCaptures(ctx, []*Capture{testCapture(n, fmt.Appendf(nil, `{"city":"Chicago","n":"N%d"}`, n))}, nil); err != nil {
			t.Fatalf("capture %d: %v", n, err)
		}
	}
	for n := range 3 {
		write(a, n)
	}
	if got := searchIDs(t, b, "Chicago"); len(got) != 3 { // b indexes what a saved
		t.Fatalf("b's search: %d matches, want 3", len(got))
	}
	for n := 3; n < 10; n++ { // a goes past its bound: it indexes as it saves
		write(a, n)
	}
	write(b, 10)
	if left, err := a.IndexSearch(ctx, 100); err != nil || left != 0 {
		t.Fatalf("a indexing: %d left, %v", left, err)
	}
	for _, db := range []*AgentStore{a, b} {
		if got := searchIDs(t, db, "Chicago"); len(got) != 11 {
			t.Errorf("search: %d matches, want 11", len(got))
		}
	}
}

// A capture whose body row is missing does not hold the backlog open (a
// search would otherwise index forever).
func TestSearchBacklogEndsPastAMissingBody(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	a, b := testCapture(1, []byte(`{"city":"Austin"}`)), testCapture(2, []byte(`{"city":"Austin"}`))
	saveCaptures(t, db, a, b)
	if _, err := db.write.ExecContext(ctx, `DELETE FROM capture_bodies WHERE seq = ?`, b.Seq); err != nil {
		t.Fatal(err)
	}
	if got := searchIDs(t, db, "Austin"); len(got) != 1 || got[0] != a.ID {
		t.Errorf("search: %v", got)
	}
	if left, err := db.IndexSearch(ctx, 10); err != nil || left != 0 {
		t.Errorf("backlog after the search: %d, %v", left, err)
	}
}

// The index is derived data: deleted, it is rebuilt; one recorded for
// another store (a copied or restored agent.db beside it) is rebuilt, not
// trusted.
func TestSearchIndexRebuilt(t *testing.T) {
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	pathA, pathB := filepath.Join(dirA, "agent.db"), filepath.Join(dirB, "agent.db")
	save := func(path, body string) {
		t.Helper()
		db, err := OpenAgent(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.WriteCaptures(ctx, []*Capture{testCapture(1, []byte(body))}, nil); err != nil {
			t.Fatal(err)
		}
		if left, err := db.IndexSearch(ctx, 10); err != nil || left != 0 {
			t.Fatalf("indexing: %d left, %v", left, err)
		}
	}
	save(pathA, `{"city":"Austin"}`)
	save(pathB, `{"city":"Boston"}`)
	search := func(path string, want map[string]int) {
		t.Helper()
		db, err := OpenAgent(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for text, n := range want {
			if got := searchIDs(t, db, text); len(got) != n {
				t.Errorf("%s: search %s: %d matches, want %d", path, text, len(got), n)
			}
		}
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		os.Remove(SearchIndexPath(pathA) + suffix)
	}
	search(pathA, map[string]int{"Austin": 1})

	index, err := os.ReadFile(SearchIndexPath(pathB))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(SearchIndexPath(pathA), index, 0o600); err != nil {
		t.Fatal(err)
	}
	search(pathA, map[string]int{"Austin": 1, "Boston": 0})
}

// A backlog the writer's pace did not make (an index being rebuilt, a bound
// lowered) slows writes to the indexer's pace but does not stop them: with
// the index file locked, so that the indexer makes no progress at all, the
// writer still has its lead.
func TestSearchBacklogDoesNotStopWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	// A bound of 0 with the index held from the start, and a lead of four
	// leads: the writes below leave the backlog three leads past the bound,
	// and the writer one lead, as a lowered bound would.
	db := openAgentAt(t, path, WithSearchBacklogMax(0), withPace(func(p *searchindex.Pace) { p.Lead = 4 * searchindex.DefaultLead }))
	unlock := lockSearchIndex(t, path)
	n := 0
	for range 12 {
		var batch []*Capture
		for range searchindex.DefaultLead / 4 {
			batch = append(batch, testCapture(n, []byte(`{"city":"Denver"}`)))
			n++
		}
		if _, err := db.WriteCaptures(ctx, batch, nil); err != nil {
			t.Fatal(err)
		}
	}
	// 3 leads behind
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := db.WriteCaptures(wctx, []*Capture{testCapture(n, []byte(`{"city":"Denver"}`))}, nil); err != nil {
		t.Fatalf("a write behind a backlog it did not make: %v", err)
	}
	unlock()
	if _, count, err := db.Captures(ctx, CaptureFilter{Text: "Denver", Page: Page{Limit: 1}}); err != nil || count != n+1 {
		t.Errorf("search: %d matches, %v; want %d", count, err, n+1)
	}
}

// The newest capture deleted before the index reached it: seqs are never
// reused, so the position must still come to the highest seq ever given.
// The indexer measured its backlog against it (prepare) but indexed up to
// the newest capture left, so a backlog of one stayed for good and Close
// waited on an indexer that never stopped.
func TestSearchBacklogEndsPastADeletedNewestCapture(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db, err := OpenAgent(ctx, path, idleForever)
	if err != nil {
		t.Fatal(err)
	}
	saveCaptures(t, db, testCapture(1, []byte(`{"city":"Lima"}`)), testCapture(2, []byte(`{"city":"Quito"}`)))
	if _, err := db.DeleteCaptures(ctx, testCapture(2, nil).ID); err != nil {
		t.Fatal(err)
	}
	closeWithin(t, db)
	db, err = OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	if n := db.SearchBacklog(); n != 0 {
		t.Errorf("backlog %d after catching up, want 0", n)
	}
	if got := searchIDs(t, db, "Lima"); len(got) != 1 {
		t.Errorf("search after reopening: %v", got)
	}
	closeWithin(t, db)
}

// closeWithin closes db, failing the test if Close hangs.
func closeWithin(t *testing.T, db *AgentStore) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- db.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not return within a minute: the indexer never stopped")
	}
}

// The intake log's applies keep to the indexer's pace as a direct write
// does: with the index held, they stop searchindex.DefaultLead past the bound until the
// indexer moves.
func TestSearchBacklogBoundsTheApplies(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path, WithSearchBacklogMax(0))
	defer db.Close()
	unlock := lockSearchIndex(t, path)
	var cs []*Capture
	for i := range searchindex.DefaultLead + 3*applyBatch {
		cs = append(cs, testCapture(i, []byte(`{"city":"Austin"}`)))
	}
	if _, err := db.LogCaptures(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	applied := make(chan error, 1)
	go func() { applied <- db.intake.catchUp(ctx) }()
	// The lead spent, the applies wait with a few batches pending; then the
	// indexer goes on. The deadline bounds a hang.
	held := int64(len(cs) - searchindex.DefaultLead)
	for deadline := time.Now().Add(30 * time.Second); db.intake.npending.Load() > held; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d records pending, want the applies to go on to %d", db.intake.npending.Load(), held)
		}
	}
	unlock()
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if n := db.SearchBacklog(); n > searchindex.DefaultLead+applyBatch {
		t.Fatalf("the applies left a backlog of %d, bound 0 + %d (+ a batch)", n, searchindex.DefaultLead)
	}
}

// What the intake log applies is indexed in the background too, once the
// writer is idle, with nothing else written and nobody searching.
func TestSearchIndexesTheApplies(t *testing.T) {
	ctx := context.Background()
	db := openIntakeDB(t, filepath.Join(t.TempDir(), "agent.db"))
	defer db.Close()
	if _, err := db.LogCaptures(ctx, []*Capture{testCapture(1, []byte(`{"city":"Austin"}`))}, nil); err != nil {
		t.Fatal(err)
	}
	// The deadline bounds a hang; the index takes about searchIdle.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var upto int64
		if err := db.read.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil {
			t.Fatal(err)
		}
		if upto == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("indexed up to %d 20 s after the apply, want 1", upto)
		}
	}
}

// A store reopened with captures its index lacks indexes them in the
// background from the start, before anything is written or searched.
func TestReopenIndexesTheBacklog(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openAgentAt(t, path, idleForever) // the index moves only when told
	saveCaptures(t, db, testCapture(1, []byte(`{"n":1}`)))
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	// the next two stay out of the index
	saveCaptures(t, db, testCapture(2, []byte(`{"n":2}`)), testCapture(3, []byte(`{"n":3}`)))
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openAgentAt(t, path)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var upto int64
		if err := db.read.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil {
			t.Fatal(err)
		}
		if upto == 3 {
			break
		}
		if time.Now().After(deadline) { // bounds a hang
			t.Fatalf("indexed up to %d 20 s after the reopen, want 3", upto)
		}
	}
}

// Deleting a damaged index removes its files, and says so when one of
// them cannot go.
func TestRemoveSearchIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.db")
	index := SearchIndexPath(path)
	for _, suffix := range []string{"", "-wal"} {
		if err := os.WriteFile(index+suffix, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := searchindex.Remove(path); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", "-wal"} {
		if _, err := os.Stat(index + suffix); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s after the removal: %v", index+suffix, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(index+"-shm", "inside"), 0o700); err != nil { // cannot be removed
		t.Fatal(err)
	}
	if err := searchindex.Remove(path); err == nil || !strings.Contains(err.Error(), "remove the damaged search index") {
		t.Fatalf("removing an index whose -shm cannot go: %v", err)
	}
}

// A backlog within its bound, up to the bound itself, waits for the
// writer to be idle: the indexer leaves it alone meanwhile.
func TestIndexerLeavesABacklogAtItsBound(t *testing.T) {
	db := openAgentDB(t, idleForever, WithSearchBacklogMax(2))
	saveCaptures(t, db, testCapture(1, []byte(`{"n":1}`)), testCapture(2, []byte(`{"n":2}`)))
	// A while to see that nothing happens: an indexer that went on would
	// have in milliseconds.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if n := db.SearchBacklog(); n != 2 {
			t.Fatalf("a backlog at its bound of 2, the writer not idle: %d left, want the indexer to wait", n)
		}
	}
}

// Indexing that works logs nothing.
func TestBackgroundIndexingLogsNothing(t *testing.T) {
	ctx := context.Background()
	logs := captureLog(t)
	db, err := OpenAgent(ctx, filepath.Join(t.TempDir(), "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	saveCaptures(t, db, testCapture(1, []byte(`{"n":1}`)))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var upto int64
		if err := db.read.QueryRowContext(ctx, `SELECT indexed_upto FROM search.search_progress`).Scan(&upto); err != nil {
			t.Fatal(err)
		}
		if upto == 1 {
			break
		}
		if time.Now().After(deadline) { // bounds a hang
			t.Fatal("the capture was not indexed 10 s on")
		}
	}
	if err := db.Close(); err != nil { // the indexer has stopped: what it logged is all there
		t.Fatal(err)
	}
	if got := logs.lines("indexing captures for search"); len(got) > 0 {
		t.Fatalf("indexing that worked logged %q", got)
	}
}
