package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// oddStore makes a data directory whose store holds what an export has to
// carry byte for byte: a body that looks like JSON but is not UTF-8, a
// header value that is not UTF-8, a raw byte in the query, and a capture
// tried twice (its attempt log).
func oddStore(t *testing.T) (string, []*agentdb.Capture) {
	t.Helper()
	dir := t.TempDir()
	db, err := agentDB(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	cs := []*agentdb.Capture{
		{ID: "0193a1b2-0000-7000-8000-0000000000a1", Source: "tunnel", CreatedAt: t0, Method: "POST", Path: "/hooks", Query: "q=\xe9",
			RequestHeaders: `[["Content-Type","application/json"]]`, Body: []byte("{\"a\":\"\xff\xfe\"}"), Duration: -1},
		{ID: "0193a1b2-0000-7000-8000-0000000000a2", Source: "tunnel", CreatedAt: t0.Add(time.Second), Method: "POST", Path: "/hooks",
			Body: []byte(`{"event":"call.started","call":{"call_id":"6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00"}}`), Duration: -1},
	}
	// As the agent writes them.
	hj, _ := wire.Header{{Name: "X-Weird", Value: "\xe9t\xe9"}, {Name: "Content-Type", Value: "application/json"}}.MarshalJSON()
	cs[1].RequestHeaders = string(hj)
	rhj, _ := wire.Header{{Name: "X-Back", Value: "\xff"}}.MarshalJSON()
	for _, c := range cs {
		agent.IndexCapture(c)
	}
	if _, err := db.WriteCaptures(context.Background(), cs, nil); err != nil {
		t.Fatal(err)
	}
	for n, status := range []int{503, 200} {
		u := *cs[1]
		u.Status, u.ResponseStatus, u.Attempts, u.MaxAttempts = agentdb.StatusFailed, status, n+1, 2
		u.Duration, u.DeliveredAt = time.Duration(n+1)*time.Millisecond, t0.Add(time.Duration(n+2)*time.Second)
		u.ResponseHeaders, u.ResponseBody = string(rhj), []byte("no\xff")
		if status == 200 {
			u.Status = agentdb.StatusDelivered
		}
		u.LastAttempt = &agentdb.Attempt{N: n + 1, At: u.DeliveredAt, ResponseStatus: status, Duration: u.Duration}
		if _, err := db.WriteCaptures(context.Background(), nil, []*agentdb.Capture{&u}); err != nil {
			t.Fatal(err)
		}
	}
	return dir, cs
}

// withoutSource is an export's lines as JSON values, less what may differ
// between two exports of the same captures: when it was made and where
// each capture came from.
func withoutSource(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		delete(v, "source")
		delete(v, "exported_at")
		out = append(out, v)
	}
	return out
}

// Every line of an export is UTF-8 JSON; what is not UTF-8 is carried as
// base64 and flagged, so an import gives back every byte, and an export
// of the import is the first export but for source.
func TestExportIsUTF8AndExact(t *testing.T) {
	src, cs := oddStore(t)
	file := filepath.Join(t.TempDir(), "odd.jsonl")
	if code, _, stderr := runCmd(t, "export", "--data", src, "-o", file); code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	first, _ := os.ReadFile(file)
	for i, line := range strings.Split(strings.TrimSpace(string(first)), "\n") {
		if !utf8.ValidString(line) || !json.Valid([]byte(line)) {
			t.Errorf("line %d is not UTF-8 JSON: %q", i+1, line)
		}
	}
	if strings.ContainsRune(string(first), utf8.RuneError) {
		t.Errorf("the export turned bytes into U+FFFD:\n%s", first)
	}
	dst := t.TempDir()
	if code, stdout, stderr := runCmd(t, "import", file, "--data", dst); code != 0 {
		t.Fatalf("import: %d %s %s", code, stdout, stderr)
	}
	db, err := agentDB(context.Background(), dst)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range cs {
		got, err := db.Capture(context.Background(), want.ID)
		if err != nil {
			t.Fatal(err)
		}
		var h wire.Header
		if err := h.UnmarshalJSON([]byte(got.RequestHeaders)); err != nil {
			t.Fatal(err)
		}
		if want.ID == cs[1].ID && h.Get("X-Weird") != "\xe9t\xe9" {
			t.Errorf("X-Weird came back as %q", h.Get("X-Weird"))
		}
		if !bytes.Equal(got.Body, want.Body) || got.RequestHeaders != want.RequestHeaders || got.Query != want.Query {
			t.Errorf("%s came back as %q %q %q, want %q %q %q", want.ID, got.Body, got.RequestHeaders, got.Query, want.Body, want.RequestHeaders, want.Query)
		}
	}
	answered, _ := db.Capture(context.Background(), cs[1].ID)
	var back wire.Header
	if back.UnmarshalJSON([]byte(answered.ResponseHeaders)) != nil || back.Get("X-Back") != "\xff" || !bytes.Equal(answered.ResponseBody, []byte("no\xff")) {
		t.Errorf("the answer came back as %q %q", answered.ResponseHeaders, answered.ResponseBody)
	}
	db.Close()
	again := filepath.Join(t.TempDir(), "again.jsonl")
	if code, _, stderr := runCmd(t, "export", "--data", dst, "-o", again); code != 0 {
		t.Fatalf("second export: %d %s", code, stderr)
	}
	second, _ := os.ReadFile(again)
	a, b := withoutSource(t, first), withoutSource(t, second)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Errorf("export → import → export changed more than source:\n%s\n%s", first, second)
	}

	har := filepath.Join(t.TempDir(), "odd.har")
	if code, _, stderr := runCmd(t, "export", "--data", src, "--format", "har", "-o", har); code != 0 {
		t.Fatalf("export har: %d %s", code, stderr)
	}
	hb, _ := os.ReadFile(har)
	if !utf8.Valid(hb) || !json.Valid(hb) || bytes.ContainsRune(hb, utf8.RuneError) {
		t.Errorf("the HAR is not UTF-8 JSON carrying every byte:\n%s", hb)
	}
}

// An export to a place that cannot be written names the user's path, not
// the temporary file beside it.
func TestExportToAMissingDirectoryNamesThePath(t *testing.T) {
	src, _ := exportStore(t)
	out := filepath.Join(t.TempDir(), "nonexistent", "dir", "x.jsonl")
	code, _, stderr := runCmd(t, "export", "--data", src, "-o", out)
	if code != 1 || !strings.Contains(stderr, out+":") || strings.Contains(stderr, ".x.jsonl.") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("export -o %s: %d %q", out, code, stderr)
	}
}
