package agentdb

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func openAgentDB(t *testing.T, opts ...Option) *AgentStore {
	t.Helper()
	return openAgentAt(t, filepath.Join(t.TempDir(), "agent.db"), opts...)
}

var callsT0 = time.Date(2025, 3, 14, 15, 0, 0, 0, time.UTC)

// callCapture builds a capture of one call event.
func callCapture(n int, callID, event, outcomeCode string) *Capture {
	oc := "null"
	if outcomeCode != "" {
		oc = `"` + outcomeCode + `"`
	}
	body := fmt.Sprintf(`{"id":"d%d","event":%q,"occurred_at":"2025-03-14T15:00:%02d+00:00","call":{"call_id":%q,"outcome_code":%s},"data":{}}`, n, event, n, callID, oc)
	return &Capture{ID: fmt.Sprintf("cap%d", n), Source: "tunnel", CreatedAt: callsT0.Add(time.Duration(n) * time.Second),
		Method: "POST", Path: "/hook", Body: []byte(body), Event: event, CallID: callID, DeliveryID: fmt.Sprintf("d%d", n),
		OccurredAt: fmt.Sprintf("2025-03-14T15:00:%02d+00:00", n)}
}

func callIDs(rows []CallRow) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.CallID)
	}
	return out
}

func TestCallsListingAndFilters(t *testing.T) {
	db := openAgentDB(t)
	ctx := context.Background()
	caps := []*Capture{
		callCapture(1, "A", "call.started", ""),
		callCapture(2, "B", "call.started", ""),
		callCapture(3, "A", "call.connected", ""),
		callCapture(4, "C", "call.started", ""),
		callCapture(5, "B", "call.failed", "busy"),
		callCapture(6, "A", "call.ended", ""),
		callCapture(7, "C", "call.failed", "no_answer"),
		// Not a call event: not listed.
		{ID: "other", Source: "tunnel", CreatedAt: callsT0.Add(8 * time.Second), Method: "POST", Path: "/x", Body: []byte("a=b")},
		// Indexed as a call, but a body that is not JSON must not break the outcome filter.
		{ID: "junk", Source: "tunnel", CreatedAt: callsT0.Add(9 * time.Second), Method: "POST", Path: "/x", Body: []byte{0xff, '{'}, Event: "call.ended", CallID: "D"},
	}
	if _, err := db.WriteCaptures(ctx, caps, nil); err != nil {
		t.Fatal(err)
	}
	rows, count, err := db.Calls(ctx, CallFilter{Page: Page{Limit: 50}})
	if err != nil {
		t.Fatal(err)
	}
	if count != 4 || !reflect.DeepEqual(callIDs(rows), []string{"D", "C", "A", "B"}) {
		t.Fatalf("count %d, order %v", count, callIDs(rows))
	}
	a := rows[2]
	if a.Captures != 3 || !a.FirstAt.Equal(callsT0.Add(time.Second)) || !a.LastAt.Equal(callsT0.Add(6*time.Second)) {
		t.Errorf("A: %+v", a)
	}

	// Paging: count ignores limit and offset.
	rows, count, err = db.Calls(ctx, CallFilter{Page: Page{Limit: 2, Offset: 1}})
	if err != nil || count != 4 || !reflect.DeepEqual(callIDs(rows), []string{"C", "A"}) {
		t.Errorf("page: %v %d %v", callIDs(rows), count, err)
	}
	rows, count, err = db.Calls(ctx, CallFilter{Event: "call.failed", Page: Page{Limit: 50}})
	if err != nil || count != 2 || !reflect.DeepEqual(callIDs(rows), []string{"C", "B"}) {
		t.Errorf("event filter: %v %d %v", callIDs(rows), count, err)
	}
	rows, count, err = db.Calls(ctx, CallFilter{OutcomeCode: "busy", Page: Page{Limit: 50}})
	if err != nil || count != 1 || !reflect.DeepEqual(callIDs(rows), []string{"B"}) {
		t.Errorf("outcome filter: %v %d %v", callIDs(rows), count, err)
	}
	rows, _, err = db.Calls(ctx, CallFilter{All: true, Page: Page{Limit: 1}})
	if err != nil || len(rows) != 4 {
		t.Errorf("all: %v %v", callIDs(rows), err)
	}

	got, err := db.CallCaptures(ctx, "A", "B", "nope")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got["A"]) != 3 || got["A"][0].ID != "cap1" || got["A"][2].Event != "call.ended" || string(got["B"][1].Body) != string(caps[4].Body) {
		t.Errorf("captures: %+v", got)
	}
}

func TestCallCapturesBatches(t *testing.T) {
	db := openAgentDB(t)
	ctx := context.Background()
	var caps []*Capture
	var ids []string
	for i := 0; i < callBatch+20; i++ {
		id := fmt.Sprintf("call-%04d", i)
		caps = append(caps, callCapture(i, id, "call.started", ""))
		caps[i].ID = fmt.Sprintf("cap-%04d", i)
		caps[i].DeliveryID = id
		ids = append(ids, id)
	}
	if _, err := db.WriteCaptures(ctx, caps, nil); err != nil {
		t.Fatal(err)
	}
	got, err := db.CallCaptures(ctx, ids...)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Errorf("%d calls loaded, want %d", len(got), len(ids))
	}
}
