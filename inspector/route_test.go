package inspector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/storage/agentdb"
)

// routedCaptures saves, as the agent does with a route file, a capture
// the route alice delivered, one the route quiet stored only (calltap
// answered its sender), and one no route file decided, oldest first.
func routedCaptures(t *testing.T, db *agentdb.AgentStore) (alice, quiet, none string) {
	t.Helper()
	at := time.Now().UTC().Add(-time.Minute)
	var cs []*agentdb.Capture
	for i, r := range []struct{ route, status, event string }{
		{"alice", agentdb.StatusDelivered, "call.started"},
		{"quiet", agentdb.StatusStored, "call.connected"},
		{"", agentdb.StatusDelivered, "call.ended"},
	} {
		cs = append(cs, &agentdb.Capture{ID: uuid.NewString(), Source: "tunnel", CreatedAt: at.Add(time.Duration(i) * time.Second),
			Method: "POST", Path: "/voice", RequestHeaders: `[["Content-Type","application/json"]]`,
			Body: fmt.Appendf(nil, `{"event":%q,"call":{"call_id":"c-route"}}`, r.event), Event: r.event, CallID: "c-route", Route: r.route, Status: r.status, Duration: -1})
	}
	if _, err := db.WriteCaptures(context.Background(), cs, nil); err != nil {
		t.Fatal(err)
	}
	return cs[0].ID, cs[1].ID, cs[2].ID
}

// The export keeps each capture's route and status, and an import gives
// them back; HAR carries the route in the entry's _route, beside its _id.
func TestExportKeepsTheRoute(t *testing.T) {
	ctx := context.Background()
	src := callsOpenDB(t)
	alice, quiet, none := routedCaptures(t, src)
	var out strings.Builder
	if _, err := inspector.Export(ctx, src, inspector.ExportOptions{}, &out); err != nil {
		t.Fatal(err)
	}
	ef, err := inspector.ReadExport(strings.NewReader(out.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	dst := callsOpenDB(t)
	if n, err := inspector.Import(ctx, dst, ef.Captures); err != nil || n != 3 {
		t.Fatalf("import: %d, %v", n, err)
	}
	for id, want := range map[string][2]string{alice: {"alice", agentdb.StatusDelivered}, quiet: {"quiet", agentdb.StatusStored}, none: {"", agentdb.StatusDelivered}} {
		c, err := dst.Capture(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.Route != want[0] || c.Status != want[1] {
			t.Errorf("imported %s: route %q, status %q; want %q, %q", id, c.Route, c.Status, want[0], want[1])
		}
	}
	if got, _, err := dst.Captures(ctx, agentdb.CaptureFilter{Route: "quiet", Page: agentdb.Page{Limit: 10}}); err != nil || len(got) != 1 || got[0].ID != quiet {
		t.Errorf("the imported store filtered by route quiet: %v", err)
	}

	var har strings.Builder
	if _, err := inspector.ExportHAR(ctx, src, inspector.ExportOptions{}, "test", &har); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Log struct {
			Entries []struct {
				ID    string `json:"_id"`
				Route string `json:"_route"`
			} `json:"entries"`
		} `json:"log"`
	}
	if err := json.Unmarshal([]byte(har.String()), &doc); err != nil {
		t.Fatal(err)
	}
	for _, e := range doc.Log.Entries {
		if want := map[string]string{alice: "alice", quiet: "quiet", none: ""}[e.ID]; e.Route != want {
			t.Errorf("HAR entry %s: _route %q, want %q", e.ID, e.Route, want)
		}
	}
	if len(doc.Log.Entries) != 3 {
		t.Errorf("HAR: %d entries, want 3", len(doc.Log.Entries))
	}
}
