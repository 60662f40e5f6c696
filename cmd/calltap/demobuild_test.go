package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make demo's first build is not a wall of package names followed by a
// silent minute: SQLite is built first under one line that names it and
// gives the time it took, and the build's own chatter stays out of sight.
// A stand-in for go (GO=…) prints package names as go build -v does and
// notes each build, so the test needs no minute of cgo.
func TestDemoBuildNamesTheLongStep(t *testing.T) {
	dir := t.TempDir()
	fakeGo := filepath.Join(dir, "go")
	log := filepath.Join(dir, "builds")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\nfor p in runtime net/http github.com/mattn/go-sqlite3; do echo $p >&2; done\nsleep 1\n"
	if err := os.WriteFile(fakeGo, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-s", "-C", "../..", "demo-build", "GO="+fakeGo, "BIN="+filepath.Join(dir, "calltap"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make demo-build: %v\n%s", err, out)
	}
	text := string(out)
	// The expected time is said before the build starts, not only while it
	// runs (a newcomer saw 3 min 33 s with no word of how long to wait).
	first, _, _ := strings.Cut(text, "\n")
	if !strings.Contains(first, "minutes") || strings.Contains(first, "compiling SQLite") {
		t.Errorf("the first line does not say how long the build takes before it starts: %q", first)
	}
	if strings.Contains(text, "net/http") {
		t.Errorf("the build's package list reached the reader:\n%s", text)
	}
	var named bool
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, "compiling SQLite") && strings.Contains(l, "done in ") && strings.HasSuffix(l, "s") {
			named = true
		}
	}
	if !named {
		t.Errorf("no line names SQLite's compile and its time:\n%s", text)
	}
	builds, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(builds)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "github.com/mattn/go-sqlite3") || !strings.Contains(lines[1], "./cmd/calltap") {
		t.Errorf("want SQLite built first, then calltap; go ran with:\n%s", builds)
	}
	// Both builds share -trimpath, so the second reuses the first.
	for _, l := range lines {
		if !strings.Contains(l, "-trimpath") {
			t.Errorf("a build without -trimpath does not share the cache: %s", l)
		}
	}
}
