package storage

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

func searchIDs(t *testing.T, db *DB, text string) []string {
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

// A capture is found by text search as soon as it is saved, though the
// full-text index takes it later; indexing then leaves no backlog and the
// same answers.
func TestSearchSeesCapturesNotYetIndexed(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var cs []*Capture
	for i := range 10 {
		cs = append(cs, testCapture(i, fmt.Appendf(nil, `{"city":"Denver","lead_id":"L-%d"}`, i)))
	}
	if err := db.WriteCaptures(ctx, cs, nil); err != nil {
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
	if err := db.WriteCaptures(ctx, []*Capture{more}, nil); err != nil {
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

// Beyond the bound, each commit indexes as many old captures as it saves.
func TestSearchBacklogIsBounded(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	db.SetSearchBacklogMax(5)
	for i := range 20 {
		if err := db.WriteCaptures(ctx, []*Capture{testCapture(i, []byte(`{"city":"Austin"}`))}, nil); err != nil {
			t.Fatal(err)
		}
		if n := db.SearchBacklog(); n > 6 {
			t.Fatalf("after capture %d the backlog is %d, bound 5", i, n)
		}
	}
	if got := searchIDs(t, db, "Austin"); len(got) != 20 {
		t.Errorf("search: %d matches, want 20", len(got))
	}
}

// The position survives a restart: a new process indexes what an old one
// saved and never indexed.
func TestSearchBacklogSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db, err := Open(ctx, path, SchemaAgent)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.WriteCaptures(ctx, []*Capture{testCapture(1, []byte(`{"city":"Seattle"}`))}, nil); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err = Open(ctx, path, SchemaAgent)
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
	a, err := Open(ctx, path, SchemaAgent)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, path, SchemaAgent)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.SetSearchBacklogMax(3)
	write := func(db *DB, n int) {
		t.Helper()
		if err := db.WriteCaptures(ctx, []*Capture{testCapture(n, fmt.Appendf(nil, `{"city":"Chicago","n":"N%d"}`, n))}, nil); err != nil {
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
	for _, db := range []*DB{a, b} {
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
	if err := db.WriteCaptures(ctx, []*Capture{a, b}, nil); err != nil {
		t.Fatal(err)
	}
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
