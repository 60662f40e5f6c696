package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/calltap/calltap/storage/agentdb"
)

// routedStore is a data directory holding, imported from an export, a
// capture the route alice delivered, one the route quiet stored only, and
// one no route file decided.
func routedStore(t *testing.T) (dir string, alice, quiet, none string) {
	t.Helper()
	alice, quiet, none = "02aa0000-0000-7000-8000-000000000001", "02bb0000-0000-7000-8000-000000000002", "02cc0000-0000-7000-8000-000000000003"
	var b strings.Builder
	b.WriteString(`{"format":"calltap-export","version":1,"exported_at":"2026-11-22T10:00:00Z","masked_headers":[],"redacted_paths":[]}` + "\n")
	for i, r := range []struct{ id, route, status string }{{alice, "alice", agentdb.StatusDelivered}, {quiet, "quiet", agentdb.StatusStored}, {none, "", agentdb.StatusDelivered}} {
		fmt.Fprintf(&b, `{"id":%q,"created_at":"2026-11-22T10:00:0%dZ","method":"POST","path":"/hooks","body":"{}","route":%q,"status":%q}`+"\n", r.id, i, r.route, r.status)
	}
	file := filepath.Join(t.TempDir(), "routed.jsonl")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if code, out, stderr := runCmd(t, "import", "--data", dir, file); code != 0 {
		t.Fatalf("import: %d %s%s", code, out, stderr)
	}
	return dir, alice, quiet, none
}

// requests --route lists what a route took; --json gives each capture's
// route; the table has a ROUTE column when a listed capture has a route,
// and a store-only capture is flagged stored-only, not failed.
func TestRequestsByRoute(t *testing.T) {
	dir, alice, quiet, none := routedStore(t)
	code, out, stderr := runCmd(t, "requests", "--data", dir, "--route", "quiet")
	if code != 0 || !strings.Contains(out, quiet) || strings.Contains(out, alice) || strings.Contains(out, none) {
		t.Fatalf("requests --route quiet: %d\n%s%s", code, out, stderr)
	}
	head, rest, _ := strings.Cut(out, "\n")
	if !strings.Contains(head, "EVENT  ROUTE") || !strings.Contains(rest, " quiet ") || !strings.Contains(rest, "stored-only") || strings.Contains(rest, "failed") {
		t.Errorf("requests --route quiet: want a ROUTE column naming quiet and the flag stored-only:\n%s", out)
	}

	code, out, stderr = runCmd(t, "requests", "--data", dir, "--json")
	var p struct {
		Results []map[string]any `json:"results"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &p) != nil || len(p.Results) != 3 {
		t.Fatalf("requests --json: %d\n%s%s", code, out, stderr)
	}
	for _, r := range p.Results {
		want := map[string]string{alice: "alice", quiet: "quiet", none: ""}[r["id"].(string)]
		if got, ok := r["route"]; !ok || got != want {
			t.Errorf("requests --json: capture %s has route %v (present %v), want %q", r["id"], got, ok, want)
		}
	}

	// The column, after EVENT, names each capture's route; - for none.
	code, out, _ = runCmd(t, "requests", "--data", dir)
	if f := strings.Fields(out); code != 0 || len(f) < 7 || f[5] != "ROUTE" {
		t.Fatalf("requests: want a ROUTE column after EVENT:\n%s", out)
	}
	for id, want := range map[string]string{alice: "alice", quiet: "quiet", none: "-"} {
		// ID, date and time, METHOD, PATH, EVENT, ROUTE
		if f := strings.Fields(lineOf(out, id)); len(f) < 7 || f[6] != want {
			t.Errorf("requests: the line of %s reads %q, want route %s", id, lineOf(out, id), want)
		}
	}
	// Without a route, the table is as it was.
	refDir, _, _, _ := refStore(t)
	if code, out, _ := runCmd(t, "requests", "--data", refDir); code != 0 || strings.Contains(out, "ROUTE") || !strings.HasPrefix(out, "ID") {
		t.Errorf("requests on a store without routes shows a ROUTE column:\n%s", out)
	}
}

// lineOf is the line of out that names id.
func lineOf(out, id string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, id) {
			return l
		}
	}
	return ""
}
