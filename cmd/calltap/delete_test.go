package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// calltap delete and keep on a store: by ID, by call, by age (sparing a
// kept capture); without a terminal it wants --yes, as a usage error.
func TestDeleteAndKeepCommands(t *testing.T) {
	dir, cs := exportStore(t)
	left := func() map[string]bool {
		t.Helper()
		db, err := agentDB(context.Background(), dir)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		out := map[string]bool{}
		for _, c := range cs {
			if _, err := db.Capture(context.Background(), c.ID); err == nil {
				out[c.ID] = true
			} else if !errors.Is(err, storage.ErrNotFound) {
				t.Fatal(err)
			}
		}
		return out
	}
	for _, args := range [][]string{
		{"delete", "--data", dir, cs[0].ID},                            // no terminal, no --yes
		{"delete", "--data", dir, "--yes"},                             // nothing to delete
		{"delete", "--data", dir, "--yes", "--call-id", "x", cs[0].ID}, // two ways at once
		{"delete", "--data", dir, "--yes", "--before", "someday"},
		{"keep", "--data", dir},
	} {
		code, _, stderr := runCmd(t, args...)
		if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.HasPrefix(stderr, "calltap "+args[0]+": ") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, code, stderr)
		}
	}
	if len(left()) != 4 {
		t.Fatal("a refused delete deleted")
	}
	if code, out, stderr := runCmd(t, "delete", "--data", dir, "--yes", cs[0].ID); code != 0 || !strings.Contains(out, "Deleted 1 capture") {
		t.Fatalf("delete ID: %d %q %q", code, out, stderr)
	}
	if code, _, stderr := runCmd(t, "delete", "--data", dir, "--yes", "--call-id", "6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00"); code != 0 {
		t.Fatalf("delete --call-id: %d %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "keep", "--data", dir, cs[3].ID); code != 0 {
		t.Fatalf("keep: %d %q", code, stderr)
	}
	if code, _, _ := runCmd(t, "keep", "--data", dir, "no-such-id"); code != 1 {
		t.Fatalf("keep of an unknown ID: %d, want 1", code)
	}
	if code, _, stderr := runCmd(t, "delete", "--data", dir, "--yes", "--before", time.Now().Format(time.RFC3339)); code != 0 {
		t.Fatalf("delete --before: %d %q", code, stderr)
	}
	if got := left(); len(got) != 1 || !got[cs[3].ID] {
		t.Fatalf("left %v, want only the kept %s", got, cs[3].ID)
	}
	if code, _, _ := runCmd(t, "delete", "--data", dir, "--yes", "no-such-id"); code != 1 {
		t.Fatalf("delete of an unknown ID: %d, want 1", code)
	}
}

func TestRetentionFlags(t *testing.T) {
	var d durationDays
	var b byteSize
	for in, want := range map[string]time.Duration{"30d": 30 * 24 * time.Hour, "72h": 72 * time.Hour, "0": 0} {
		if err := d.Set(in); err != nil || time.Duration(d) != want {
			t.Errorf("--retain %s: %v %v", in, time.Duration(d), err)
		}
	}
	for in, want := range map[string]int64{"5GiB": 5 << 30, "500MB": 500e6, "0": 0, "1024": 1024} {
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("--max-store %s: %d %v", in, b, err)
		}
	}
	for _, in := range []string{"-1d", "soon", "5XB", "-3"} {
		if d.Set(in) == nil && b.Set(in) == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// --retain keeps its word at short settings: the agent prunes every tenth
// of it, so a capture saved after the start-up prune is gone a few
// seconds after it is 3 s old, not 10 minutes later. The 2-minute limit
// bounds a hang on a busy machine; it is far below the old 10 minutes.
func TestShortRetainPrunesSoon(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	dir := t.TempDir()
	dev := start(t, "dev", "--forward-to", h.URL, "--listen", freeAddr(t), "--inspect", "", "--data", dir, "--retain", "3s")
	url := tunnelURL(t, dev)
	if code := postStatus(url, `{"id":"dlv-retain","event":"call.started"}`); code != http.StatusOK {
		t.Fatalf("a request through the tunnel: %d", code)
	}
	polltest.Until(t, 10*time.Second, func() bool {
		_, out, _ := runCmd(t, "requests", "--data", dir, "--id", "dlv-retain")
		return strings.Contains(out, "1 of 1")
	}, "the capture was never listed")
	polltest.Until(t, 2*time.Minute, func() bool {
		code, _, _ := runCmd(t, "requests", "--data", dir, "--id", "dlv-retain")
		return code == 1 // not found
	}, "a capture past --retain 3s was not pruned within 2 minutes")
	for _, c := range []struct {
		retain time.Duration
		want   time.Duration
	}{{0, 10 * time.Minute}, {30 * 24 * time.Hour, 10 * time.Minute}, {time.Minute, 6 * time.Second}, {3 * time.Second, time.Second}} {
		if got := retainInterval(agentdb.Retention{MaxAge: c.retain, MaxBytes: 1}); got != c.want {
			t.Errorf("--retain %s: prunes every %s, want %s", c.retain, got, c.want)
		}
	}
}
