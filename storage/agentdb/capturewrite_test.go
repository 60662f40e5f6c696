package agentdb

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/agentdb/searchindex"
)

// A capture saved without a status or an attempt bound gets the defaults
// (pending, one attempt); one given them keeps them.
func TestWriteCapturesDefaults(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	bare, given := testCapture(1, []byte(`{"n":1}`)), testCapture(2, []byte(`{"n":2}`))
	given.Status, given.MaxAttempts = StatusDelivered, 5
	saveCaptures(t, db, bare, given)
	for c, want := range map[*Capture]struct {
		status string
		max    int
	}{bare: {StatusPending, 1}, given: {StatusDelivered, 5}} {
		got, err := db.Capture(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != want.status || got.MaxAttempts != want.max {
			t.Errorf("%s: status %q, max attempts %d; want %q, %d", c.ID, got.Status, got.MaxAttempts, want.status, want.max)
		}
	}
}

// An answer without a status (the target refused the connection) is
// recorded as none, not as status 0, and so is its attempt; a duration of
// zero is a duration, not an unknown one.
func TestWriteCapturesAnswerWithoutStatus(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	c := testCapture(1, []byte(`{"n":1}`))
	saveCaptures(t, db, c)
	u := *c
	u.Status, u.Error, u.Attempts, u.Duration = StatusFailed, "connection refused", 1, 0
	u.LastAttempt = &Attempt{N: 1, At: capT0, Error: "connection refused"}
	if _, err := db.WriteCaptures(ctx, nil, []*Capture{&u}); err != nil {
		t.Fatal(err)
	}
	got, err := db.Capture(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Duration != 0 {
		t.Errorf("duration %v, want 0 (known)", got.Duration)
	}
	if _, n, err := db.Captures(ctx, CaptureFilter{StatusClass: "none", Page: Page{Limit: 10}}); err != nil || n != 1 {
		t.Errorf("captures without a response status: %d, %v; want 1", n, err)
	}
	var null bool
	if err := db.read.QueryRowContext(ctx, `SELECT response_status IS NULL FROM attempts WHERE capture_id = ?`, c.ID).Scan(&null); err != nil || !null {
		t.Errorf("the attempt's response status NULL: %v, %v; want true", null, err)
	}
}

// Bodies up to searchindex.MaxBody bytes of UTF-8 go into the full-text
// index; empty, larger or binary ones do not.
func TestIndexable(t *testing.T) {
	atBound := bytes.Repeat([]byte("a"), searchindex.MaxBody)
	for _, tc := range []struct {
		name string
		body []byte
		want bool
	}{
		{"empty", []byte{}, false},
		{"nil", nil, false},
		{"one byte", []byte("a"), true},
		{"at the bound", atBound, true},
		{"past the bound", append(atBound, 'a'), false},
		{"binary", binaryBody, false},
	} {
		if got := searchindex.Indexable(tc.body); got != tc.want {
			t.Errorf("%s: indexable %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An answer is recorded while the search index is further behind than its
// bound, without waiting for the indexer: only inserts keep to its pace.
func TestAnswersDoNotWaitForTheIndex(t *testing.T) {
	ctx := context.Background()
	path := t.TempDir() + "/agent.db"
	db := openAgentAt(t, path, WithSearchBacklogMax(0))
	unlock := lockSearchIndex(t, path)
	defer unlock()
	var first []*Capture
	for i := range searchindex.DefaultLead + 100 {
		first = append(first, testCapture(i, []byte(`{"city":"Austin"}`)))
	}
	saveCaptures(t, db, first...)
	if n := db.SearchBacklog(); n <= searchindex.DefaultLead {
		t.Fatalf("backlog %d, want it past the lead %d", n, searchindex.DefaultLead)
	}
	// The deadline bounds a hang; the write takes milliseconds.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := db.WriteCaptures(ctx, nil, []*Capture{answeredCapture(first[0])}); err != nil {
		t.Fatalf("an answer while the index is held: %v", err)
	}
	// Held, the indexer gives up only after the busy timeout (10 s); an
	// answer that waited for it returns only once it has.
	if failed := db.index.Err(); failed != nil {
		t.Errorf("the answer was recorded only once the indexer gave up (%v): it waited for the index", failed)
	}
}
