package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const routesTestFile = `[[route]]
name = "enders"
events = ["call.ended"]
forward-to = "http://127.0.0.1:3001/hooks"

[[route]]
name = "multi"
header = { "X-Multi" = "two" }
path = "/hooks/*"
match = { "call.call_id" = "6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c01" }
store-only = true
`

func writeRoutes(t *testing.T, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "routes.toml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// calltap routes check runs a store's captures through a route file:
// per route counts, and the calls that would leave the default they took.
func TestRoutesCheck(t *testing.T) {
	dir, _ := exportStore(t)
	file := writeRoutes(t, routesTestFile)
	code, out, stderr := runCmd(t, "routes", "check", file, "--data", dir, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got struct {
		Captures        int            `json:"captures"`
		Routes          map[string]int `json:"routes"`
		ChangedCaptures int            `json:"changed_captures"`
		ChangedCalls    []struct {
			CallID   string   `json:"call_id"`
			Took     []string `json:"took"`
			Would    []string `json:"would"`
			Captures int      `json:"captures"`
		} `json:"changed_calls"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if want := map[string]int{"enders": 1, "multi": 1, "default": 2}; got.Captures != 4 || !reflect.DeepEqual(got.Routes, want) || got.ChangedCaptures != 2 {
		t.Fatalf("captures %d, routes %v, changed %d; want 4, %v, 2", got.Captures, got.Routes, got.ChangedCaptures, want)
	}
	calls := ""
	for _, c := range got.ChangedCalls {
		calls += c.CallID + ":" + strings.Join(c.Took, ",") + ">" + strings.Join(c.Would, ",") + ":" + strings.Repeat("*", c.Captures) + " "
	}
	if want := "6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00:default>default,enders:* 6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c01:default>multi:* "; calls != want {
		t.Fatalf("changed calls %q, want %q", calls, want)
	}

	code, out, stderr = runCmd(t, "routes", "check", "--data", dir, file)
	if code != 0 {
		t.Fatalf("text: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"enders   1", "multi    1", "default  2", "2 call(s) would change route (2 capture(s) in all)",
		"6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c01  default -> multi", "against 4 capture(s) in "} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}

	// The event filter stores what it leaves out.
	code, out, stderr = runCmd(t, "routes", "check", "--data", dir, "--events", "call.started", "--json", file)
	if code != 0 || !strings.Contains(out, `"routes":{"default":1,"enders":0,"filtered":2,"multi":1}`) {
		t.Fatalf("--events: exit %d, %s %s", code, out, stderr)
	}
}

// A route file that does not check exits 2 with one line: the file, the
// line and what is wrong; so do usage errors. No store is a failure (1).
func TestRoutesCheckRefusals(t *testing.T) {
	dir, _ := exportStore(t)
	bad := writeRoutes(t, strings.Replace(routesTestFile, "store-only = true", "store-only = true\nforward-to = \"http://x\"", 1))
	code, _, stderr := runCmd(t, "routes", "check", bad, "--data", dir)
	if want := "calltap routes: routes.toml:11: route \"multi\": forward-to and store-only both set\n"; code != 2 || stderr != want {
		t.Errorf("bad file: exit %d, stderr %q; want 2 and %q", code, stderr, want)
	}
	good := writeRoutes(t, routesTestFile)
	for _, args := range [][]string{
		{"routes"},
		{"routes", "verify", good},
		{"routes", "check"},
		{"routes", "check", good, good},
		{"routes", "check", good, "--bogus"},
		{"routes", "check", good, "--data", dir, "--events", "call.["},
		{"routes", "check", filepath.Join(dir, "none.toml"), "--data", dir},
	} {
		code, _, stderr := runCmd(t, args...)
		if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.HasPrefix(stderr, "calltap routes: ") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, code, stderr)
		}
	}
	if code, _, stderr := runCmd(t, "routes", "check", good, "--data", t.TempDir()); code != 1 || !strings.Contains(stderr, "no store at") {
		t.Errorf("no store: exit %d, %q", code, stderr)
	}
	for _, args := range [][]string{{"routes", "-h"}, {"routes", "check", "-h"}, {"help", "routes"}} {
		if code, out, _ := runCmd(t, args...); code != 0 || !strings.Contains(out, "calltap routes check FILE") {
			t.Errorf("%v: exit %d, %q", args, code, out)
		}
	}
}
