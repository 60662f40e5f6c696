package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Commands that only read the store create nothing where there is none,
// and say which store they looked at, or that there is none.
func TestReadOnlyCommandsCreateNoStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	store := filepath.Join(dir, "agent.db")
	for _, args := range [][]string{
		{"requests", "--data", dir},
		{"requests", "--data", dir, "--json"},
		{"export", "--data", dir},
	} {
		code, stdout, stderr := runCmd(t, args...)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("%v created %s (%v)", args, dir, err)
		}
		if !strings.Contains(stderr, "no store at "+store) {
			t.Errorf("%v: stderr %q does not say there is no store at %s", args, stderr, store)
		}
		if n := strings.Count(strings.TrimRight(stderr, "\n"), "\n"); n != 0 {
			t.Errorf("%v: want one line on stderr, got %q", args, stderr)
		}
		switch args[0] {
		case "requests": // an empty list is no failure
			if code != 0 {
				t.Errorf("%v: exit %d, want 0", args, code)
			}
			if len(args) == 4 {
				var page struct {
					Count   int               `json:"count"`
					Results []json.RawMessage `json:"results"`
				}
				if err := json.Unmarshal([]byte(stdout), &page); err != nil || page.Count != 0 || page.Results == nil || len(page.Results) != 0 {
					t.Errorf("%v: stdout %q, want an empty page", args, stdout)
				}
			}
		case "export": // nothing to export is exit 1, as an empty selection is
			if code != 1 || stdout != "" {
				t.Errorf("%v: exit %d, stdout %q; want 1 and nothing", args, code, stdout)
			}
		}
	}

	// With a store, requests names it.
	db, err := agentDB(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	code, stdout, _ := runCmd(t, "requests", "--data", dir)
	if code != 0 || !strings.Contains(stdout, " in "+store) {
		t.Errorf("requests: exit %d, stdout %q; want the store %s named", code, stdout, store)
	}
}

// The usage line of requests names every flag it takes, and help says
// export writes HAR as well as JSON Lines.
func TestRequestsUsageAndExportHelp(t *testing.T) {
	_, stdout, stderr := runCmd(t, "requests", "-h")
	usage := strings.SplitN(stdout+stderr, "\n", 2)[0]
	for _, flag := range []string{"--event", "--call-id", "--status", "--q", "--limit", "--offset", "--data", "--json"} {
		if !strings.Contains(usage, flag+" ") && !strings.Contains(usage, flag+"]") {
			t.Errorf("requests usage line %q leaves out %s", usage, flag)
		}
	}
	_, stdout, stderr = runCmd(t, "help")
	for _, line := range strings.Split(stdout+stderr, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "export") && !strings.Contains(line, "HAR") {
			t.Errorf("help describes export as %q, without HAR", line)
		}
	}
}
