package agentdb

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
)

// A reader opened while an agent owns the store (its intake log) sees
// every capture the agent logged before it opened, though the agent
// applies them later; it writes nothing, and says it leaves nothing out.
func TestReaderSeesWhatTheOwnerLogged(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	owner := openIntakeDB(t, path)
	defer owner.Close()
	for i := range 20 {
		if _, err := owner.LogCaptures(ctx, []*Capture{testCapture(i, []byte(`{"n":1}`))}, nil); err != nil {
			t.Fatal(err)
		}
		r, err := OpenAgentReader(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		_, n, err := r.Captures(ctx, CaptureFilter{Page: Page{Limit: 1}})
		lag, lerr := r.Behind(ctx)
		r.Close()
		if err != nil || n != i+1 {
			t.Fatalf("round %d: the reader saw %d capture(s) (%v), want %d", i, n, err, i+1)
		}
		if lerr != nil || lag != (Lag{}) {
			t.Fatalf("round %d: behind %+v (%v) while the owner runs", i, lag, lerr)
		}
	}
}

// With no agent, what a killed one left in its log is what a reader
// cannot add: Behind counts it, and a store opened to write applies it.
// A store of an older format is behind too.
func TestReaderSaysWhatItLeavesOut(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openIntakeDB(t, path)
	a := testCapture(1, []byte(`{"n":1}`))
	if _, err := db.LogCaptures(ctx, []*Capture{a, testCapture(2, []byte(`{"n":2}`))}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := db.LogCaptures(ctx, nil, []*Capture{answeredCapture(a)}); err != nil {
		t.Fatal(err)
	}
	crash(t, db)
	r, err := OpenAgentReader(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	lag, err := r.Behind(ctx)
	r.Close()
	if err != nil || lag.Requests != 2 || lag.Answers != 1 {
		t.Fatalf("behind %+v (%v), want 2 requests and 1 answer", lag, err)
	}
	w, err := OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	r, err = OpenAgentReader(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	lag, _ = r.Behind(ctx)
	_, n, err := r.Captures(ctx, CaptureFilter{Page: Page{Limit: 1}})
	r.Close()
	if lag.Requests != 0 || lag.Answers != 0 || n != 2 || err != nil {
		t.Fatalf("once applied: behind %+v, %d captures (%v)", lag, n, err)
	}

	old := filepath.Join(t.TempDir(), "agent.db")
	sdb, err := sql.Open("sqlite3", "file:"+old+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	sdb.SetMaxOpenConns(1)
	migrateThrough(t, sdb, "0005_contentless_fts.sql")
	sdb.Close()
	r, err = OpenAgentReader(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	lag, err = r.Behind(ctx)
	r.Close()
	if err != nil || lag.Migrations == 0 {
		t.Fatalf("a store of an older format: behind %+v (%v)", lag, err)
	}
}

// A reader's search waits for the agent owning the store to index what
// it logged (it does once idle): the capture is found.
func TestReaderSearchWaitsForTheOwnersIndex(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	owner := openIntakeDB(t, path)
	defer owner.Close()
	c := testCapture(1, []byte(`{"city":"Tucson"}`))
	if _, err := owner.LogCaptures(ctx, []*Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	r, err := OpenAgentReader(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, n, err := r.Captures(ctx, CaptureFilter{Text: "Tucson", Page: Page{Limit: 10}})
	if err != nil || n != 1 || len(got) != 1 || got[0].ID != c.ID {
		t.Fatalf("the reader's search: %d found (%v), want %s", n, err, c.ID)
	}
}

// Behind counts only what a killed agent logged past the position it had
// applied to, in the log file it stopped in; a log it had applied whole
// leaves nothing out.
func TestReaderCountsOnlyWhatIsNotApplied(t *testing.T) {
	holdApplies(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	behind := func() Lag {
		t.Helper()
		r, err := OpenAgentReader(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		lag, err := r.Behind(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return lag
	}
	db := openIntakeDB(t, path)
	a := testCapture(1, []byte(`{"n":1}`))
	if _, err := db.LogCaptures(ctx, []*Capture{a, testCapture(2, []byte(`{"n":2}`))}, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.intake.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	crash(t, db)
	if lag := behind(); lag.Requests != 0 || lag.Answers != 0 {
		t.Fatalf("a log applied whole: behind %+v, want nothing", lag)
	}

	db = openIntakeDB(t, path)
	if _, err := db.LogCaptures(ctx, []*Capture{testCapture(3, []byte(`{"n":3}`))}, []*Capture{answeredCapture(a)}); err != nil {
		t.Fatal(err)
	}
	if db.intake.log.Gen() != db.intake.applied.gen {
		t.Fatalf("the log moved to file %d; the test needs the records in the applied one (%d)", db.intake.log.Gen(), db.intake.applied.gen)
	}
	crash(t, db)
	if lag := behind(); lag.Requests != 1 || lag.Answers != 1 {
		t.Fatalf("two captures applied, one more and an answer logged: behind %+v, want 1 request and 1 answer", lag)
	}
}

// Behind counts the captures the full-text index lacks: those saved after
// the index last moved, none once it has caught up.
func TestReaderCountsTheUnindexed(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openAgentAt(t, path, idleForever) // the index moves only when told
	saveCaptures(t, db, testCapture(1, []byte(`{"n":1}`)), testCapture(2, []byte(`{"n":2}`)), testCapture(3, []byte(`{"n":3}`)))
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	unindexed := func() int64 {
		t.Helper()
		r, err := OpenAgentReader(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		lag, err := r.Behind(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return lag.Unindexed
	}
	if n := unindexed(); n != 0 {
		t.Fatalf("an index caught up: %d unindexed, want 0", n)
	}
	// the two next stay out of the index
	saveCaptures(t, db, testCapture(4, []byte(`{"n":4}`)), testCapture(5, []byte(`{"n":5}`)))
	if n := unindexed(); n != 2 {
		t.Fatalf("two captures saved after the index moved: %d unindexed, want 2", n)
	}
}
