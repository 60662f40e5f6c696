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
	var lines []string
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
		// One rule: no store is an error (exit 1, nothing on stdout),
		// said in the same words by every command that reads one.
		if code != 1 || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q; want 1 and nothing", args, code, stdout)
		}
		_, line, _ := strings.Cut(stderr, ": ")
		lines = append(lines, line)
	}
	for _, l := range lines[1:] {
		if l != lines[0] {
			t.Errorf("the commands say it differently: %q and %q", lines[0], l)
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
	for _, flag := range []string{"--event", "--call-id", "--status", "--q", "--route", "--limit", "--offset", "--data", "--json"} {
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

// --json gives machine-readable output from every command that prints
// data, as the README says: each command named there takes it, and its
// output is JSON.
func TestJSONFlagWhereTheREADMESaysSo(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "`--json` prints machine-readable output from ")
	if !ok {
		t.Fatal("the README's commands section no longer says which commands take --json")
	}
	sentence, _, _ := strings.Cut(rest, ";")
	var named []string
	for _, part := range strings.Split(sentence, "`")[1:] {
		if part = strings.TrimSpace(part); part != "" && !strings.ContainsAny(part, ",():") {
			named = append(named, part)
		}
	}
	if len(named) < 5 {
		t.Fatalf("read %q from the README's sentence %q", named, sentence)
	}
	for _, cmd := range named {
		_, stdout, _ := runCmd(t, append(strings.Fields(cmd), "-h")...)
		if !strings.Contains(stdout, "  --json\n") {
			t.Errorf("the README says %s takes --json; its help lists no --json:\n%s", cmd, stdout)
		}
	}
	code, stdout, stderr := runCmd(t, "version", "--json")
	var v struct{ Version string }
	if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil || v.Version != version {
		t.Errorf("version --json: exit %d, stdout %q, stderr %q; want {\"version\": %q}", code, stdout, stderr, version)
	}
}
