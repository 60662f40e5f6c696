package agentdb

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"
)

var capT0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func testCapture(n int, body []byte) *Capture {
	return &Capture{ID: fmt.Sprintf("0193a1b2-0000-7000-8000-%012d", n), Source: "tunnel", CreatedAt: capT0.Add(time.Duration(n) * time.Millisecond),
		Method: "POST", Path: "/voice", RequestHeaders: `[["Content-Type","application/json"]]`, Body: body,
		Target: "http://127.0.0.1:3000/voice", Event: "call.ended", CallID: fmt.Sprintf("call-%d", n/5), DeliveryID: fmt.Sprintf("d-%d", n),
		Duration: -1}
}

func answeredCapture(c *Capture) *Capture {
	u := *c
	u.Status, u.ResponseStatus, u.Attempts = StatusDelivered, 201, 1
	u.ResponseHeaders, u.ResponseBody = `[["Content-Type","text/plain"]]`, []byte("ok\x00\xff")
	u.Duration, u.DeliveredAt = 1500*time.Microsecond, c.CreatedAt.Add(2*time.Millisecond)
	u.LastAttempt = &Attempt{N: 1, At: c.CreatedAt, ResponseStatus: 201, Duration: u.Duration}
	return &u
}

// saveCaptures writes cs in one commit and sets on each what the store
// assigned to it, as the agent does.
func saveCaptures(t testing.TB, db *AgentStore, cs ...*Capture) {
	t.Helper()
	written, err := db.WriteCaptures(context.Background(), cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range written {
		cs[i].Seq, cs[i].ID, cs[i].DuplicateOf = w.Seq, w.ID, w.DuplicateOf
	}
}

// binaryBody is not UTF-8: it is kept byte-exact but not indexed.
var binaryBody = []byte{0xff, 0xfe, 0x00, 0x01, 'D', 'e', 'n', 'v', 'e', 'r', 0x80}

func TestWriteCapturesRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	a := testCapture(1, []byte(`{"city":"Denver","lead_id":"L-123"}`))
	b := testCapture(2, binaryBody)
	c := testCapture(3, nil)
	saveCaptures(t, db, a, b, c)
	if a.Seq == 0 || b.Seq != a.Seq+1 || c.Seq != b.Seq+1 {
		t.Fatalf("seqs %d %d %d", a.Seq, b.Seq, c.Seq)
	}
	if _, err := db.WriteCaptures(ctx, nil, []*Capture{answeredCapture(a)}); err != nil {
		t.Fatal(err)
	}
	got, err := db.Capture(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Body, a.Body) || got.Size != len(a.Body) || got.Status != StatusDelivered || got.ResponseStatus != 201 ||
		!bytes.Equal(got.ResponseBody, []byte("ok\x00\xff")) || got.ResponseHeaders != `[["Content-Type","text/plain"]]` ||
		got.Duration != 1500*time.Microsecond || got.Attempts != 1 || !got.CreatedAt.Equal(a.CreatedAt) {
		t.Fatalf("capture read back as %+v", got)
	}
	atts, err := db.Attempts(ctx, a.ID)
	if err != nil || len(atts) != 1 || atts[0].ResponseStatus != 201 || atts[0].N != 1 || !atts[0].At.Equal(a.CreatedAt) ||
		atts[0].Duration != 1500*time.Microsecond {
		t.Fatalf("attempts %+v, %v", atts, err)
	}
	for _, want := range []*Capture{b, c} {
		got, err := db.Capture(ctx, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Body, want.Body) || got.Body == nil || got.Status != StatusPending || got.Duration != -1 {
			t.Fatalf("capture %s read back as %+v", want.ID, got)
		}
	}
	rows, n, err := db.Captures(ctx, CaptureFilter{Page: Page{Limit: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 || len(rows) != 3 || rows[0].ID != c.ID || rows[1].Size != len(binaryBody) || rows[2].Size != len(a.Body) || rows[2].Body != nil {
		t.Fatalf("list: %d, %+v", n, rows)
	}
	calls, err := db.CallCaptures(ctx, a.CallID)
	if err != nil {
		t.Fatal(err)
	}
	if cs := calls[a.CallID]; len(cs) != 3 || !bytes.Equal(cs[1].Body, binaryBody) {
		t.Fatalf("call captures %+v", cs)
	}
}

// A queued request the relay sends again is recognised by its relay id:
// WriteCaptures reports the first copy's id and place and inserts nothing,
// and leaves the captures it was given untouched.
func TestWriteCapturesRedeliveredQueued(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	first := testCapture(1, []byte("a"))
	first.RelayID, first.Queued = "r-1", true
	w1, err := db.WriteCaptures(ctx, []*Capture{first}, nil)
	if err != nil {
		t.Fatal(err)
	}
	again := testCapture(2, []byte("a"))
	again.RelayID, again.Queued = "r-1", true
	live := testCapture(3, []byte("b"))
	live.RelayID = "r-2"
	before := []Capture{*again, *live}
	w2, err := db.WriteCaptures(ctx, []*Capture{again, live}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(w1) != 1 || w1[0].Redelivered || w1[0].ID != first.ID || w1[0].Seq == 0 {
		t.Fatalf("first write: %+v", w1)
	}
	if len(w2) != 2 || !w2[0].Redelivered || w2[0].ID != first.ID || w2[0].Seq != w1[0].Seq || w2[1].Redelivered || w2[1].ID != live.ID {
		t.Fatalf("redelivery: %+v, first %+v", w2, w1)
	}
	if !reflect.DeepEqual([]Capture{*again, *live}, before) {
		t.Errorf("WriteCaptures changed the captures it was given")
	}
	if _, n, err := db.Captures(ctx, CaptureFilter{Page: Page{Limit: 10}}); err != nil || n != 2 {
		t.Fatalf("%d captures, %v", n, err)
	}
	ids, err := db.UndeliveredQueued(ctx)
	if err != nil || len(ids) != 1 || ids[0].ID != first.ID {
		t.Fatalf("undelivered queued %v, %v", ids, err)
	}
}

// A failed batch leaves nothing behind, and the writer works afterwards.
func TestWriteCapturesRollsBack(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	a := testCapture(1, []byte("first"))
	dup := testCapture(1, []byte("same id"))
	if _, err := db.WriteCaptures(ctx, []*Capture{a, dup}, nil); err == nil {
		t.Fatal("a duplicate id was saved")
	}
	if _, n, err := db.Captures(ctx, CaptureFilter{Page: Page{Limit: 10}}); err != nil || n != 0 {
		t.Fatalf("%d captures after a failed batch, %v", n, err)
	}
	b := testCapture(2, []byte("second"))
	if _, err := db.WriteCaptures(ctx, []*Capture{b}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Capture(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
}

// A database of the schema before request bodies left the captures row
// keeps every body byte-exact, and its search, through the migration.
func TestMigrateBodiesApart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	w, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	w.SetMaxOpenConns(1)
	migrateThrough(t, w, "0005_contentless_fts.sql")
	bodies := [][]byte{[]byte(`{"city":"Denver"}`), binaryBody, {}}
	for i, body := range bodies {
		res, err := w.ExecContext(ctx, `INSERT INTO captures (id, relay_id, source, created_at, late, method, path, body, event, replay_of,
			status, response_status, response_body, attempts) VALUES (?, ?, 'tunnel', ?, ?, 'POST', '/x', ?, 'call.ended', ?, 'delivered', 200, ?, 1)`,
			fmt.Sprintf("id-%d", i), fmt.Sprintf("r-%d", i), capT0.UnixMicro(), i == 1, body, sql.NullString{String: "id-0", Valid: i == 2}, []byte("resp"))
		if err != nil {
			t.Fatal(err)
		}
		if seq, _ := res.LastInsertId(); i == 0 {
			if _, err := w.ExecContext(ctx, `INSERT INTO captures_fts (docid, body) VALUES (?, ?)`, seq, string(body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.Close()

	db, err := OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i, body := range bodies {
		c, err := db.Capture(ctx, fmt.Sprintf("id-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(c.Body, body) || c.Size != len(body) || string(c.ResponseBody) != "resp" || c.Queued != (i == 1) || c.RelayID != fmt.Sprintf("r-%d", i) {
			t.Fatalf("capture %d after the migration: %+v", i, c)
		}
	}
	rows, n, err := db.Captures(ctx, CaptureFilter{Text: "denver", Page: Page{Limit: 10}})
	if err != nil || n != 1 || len(rows) != 1 || rows[0].ID != "id-0" {
		t.Fatalf("search after the migration: %d %+v %v", n, rows, err)
	}
	if rows, _, err := db.Captures(ctx, CaptureFilter{ReplayOf: "id-0", Page: Page{Limit: 10}}); err != nil || len(rows) != 1 || rows[0].ID != "id-2" {
		t.Fatalf("replays after the migration: %+v %v", rows, err)
	}
	// New captures go on after the migrated ones.
	c := testCapture(9, []byte("new"))
	saveCaptures(t, db, c)
	if c.Seq != 4 {
		t.Fatalf("new capture got seq %d", c.Seq)
	}
}

// An id prefix (the inspector's short ids) selects the captures whose id
// starts with it, and only those.
func TestCapturesByIDPrefix(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	a, b, other := testCapture(11, nil), testCapture(12, nil), testCapture(21, nil)
	saveCaptures(t, db, a, b, other)
	for prefix, want := range map[string][]string{
		a.ID[:len(a.ID)-1]:                    {b.ID, a.ID},
		a.ID:                                  {a.ID},
		"0193a1b2-0000-7000-8000-00000000002": {other.ID},
		"ffff":                                nil,
	} {
		got, n, err := db.Captures(ctx, CaptureFilter{IDPrefix: prefix, Page: Page{Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(got), want) || n != len(want) {
			t.Errorf("prefix %q: %v (count %d), want %v", prefix, ids(got), n, want)
		}
	}
}

// EachCapture walks, page after page, every capture the filter selects,
// oldest first, bodies included, each once; an error of fn stops it.
func TestEachCaptureWalksEverything(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var cs []*Capture
	for i := range 450 { // past two pages of 200
		cs = append(cs, testCapture(i, []byte(fmt.Sprintf(`{"n":%d,"city":"Austin"}`, i))))
	}
	saveCaptures(t, db, cs...)
	var got []*Capture
	n, err := db.EachCapture(ctx, CaptureFilter{}, func(c *Capture) error { got = append(got, c); return nil })
	if err != nil || n != len(cs) || len(got) != len(cs) {
		t.Fatalf("walked %d (%d calls): %v; want %d", n, len(got), err, len(cs))
	}
	for i, c := range got {
		if c.ID != cs[i].ID || !bytes.Equal(c.Body, cs[i].Body) {
			t.Fatalf("capture %d of the walk: %s %q, want %s %q", i, c.ID, c.Body, cs[i].ID, cs[i].Body)
		}
	}
	// A filter (calls, and the text index) walks only what it selects.
	var calls []string
	n, err = db.EachCapture(ctx, CaptureFilter{CallIDs: []string{"call-1", "call-80"}, Text: "Austin"}, func(c *Capture) error {
		calls = append(calls, c.CallID)
		return nil
	})
	if want := []string{"call-1", "call-1", "call-1", "call-1", "call-1", "call-80", "call-80", "call-80", "call-80", "call-80"}; err != nil || n != len(want) || !slices.Equal(calls, want) {
		t.Errorf("walked the calls' captures: %v (%d, %v), want %v", calls, n, err, want)
	}
	stop := errors.New("stop")
	n, err = db.EachCapture(ctx, CaptureFilter{}, func(*Capture) error { return stop })
	if n != 0 || !errors.Is(err, stop) {
		t.Errorf("a walk fn stops at once: %d, %v", n, err)
	}
}

// A status class selects the captures answered in its hundred.
func TestCapturesByStatusClass(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	statuses := []int{199, 200, 299, 300, 404, 500, 599}
	var cs, answers []*Capture
	for i, s := range statuses {
		c := testCapture(i, nil)
		cs = append(cs, c)
		a := answeredCapture(c)
		a.ResponseStatus = s
		answers = append(answers, a)
	}
	pending := testCapture(len(statuses), nil)
	saveCaptures(t, db, append(cs, pending)...)
	if _, err := db.WriteCaptures(ctx, nil, answers); err != nil {
		t.Fatal(err)
	}
	for class, want := range map[string][]int{"1xx": {199}, "2xx": {200, 299}, "3xx": {300}, "4xx": {404}, "5xx": {500, 599}, "none": {0}} {
		got, _, err := db.Captures(ctx, CaptureFilter{StatusClass: class, Page: Page{Limit: 50}})
		if err != nil {
			t.Fatal(err)
		}
		var statuses []int
		for _, c := range got {
			statuses = append(statuses, c.ResponseStatus)
		}
		slices.Sort(statuses)
		if !slices.Equal(statuses, want) {
			t.Errorf("%s: statuses %v, want %v", class, statuses, want)
		}
	}
}

// A walk with text first indexes what the indexer has not yet: a capture
// just saved is found.
func TestEachCaptureSearchesWhatIsNotYetIndexed(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t, idleForever)
	c := testCapture(1, []byte(`{"city":"Reno"}`))
	saveCaptures(t, db, c)
	var got []string
	if _, err := db.EachCapture(ctx, CaptureFilter{Text: "Reno"}, func(c *Capture) error { got = append(got, c.ID); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{c.ID}) {
		t.Errorf("the walk found %v, want %s", got, c.ID)
	}
}

// A capture keeps the route it took, through the direct writer and the
// intake log alike, and a listing filters by it.
func TestCapturesKeepTheirRoute(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	a, b, none := testCapture(31, nil), testCapture(32, nil), testCapture(33, nil)
	a.Route, b.Route = "media", "default"
	saveCaptures(t, db, a)
	if _, err := db.LogCaptures(ctx, []*Capture{b, none}, nil); err != nil {
		t.Fatal(err)
	}
	for route, want := range map[string][]string{"media": {a.ID}, "default": {b.ID}, "": {none.ID, b.ID, a.ID}} {
		got, _, err := db.Captures(ctx, CaptureFilter{Route: route, Page: Page{Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(got), want) {
			t.Errorf("route %q: %v, want %v", route, ids(got), want)
		}
	}
	for id, want := range map[string]string{a.ID: "media", b.ID: "default", none.ID: ""} {
		c, err := db.Capture(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.Route != want {
			t.Errorf("capture %s: route %q, want %q", id, c.Route, want)
		}
	}
}
