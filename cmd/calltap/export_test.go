package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/martian/v3/har"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// exportStore makes a data directory whose store holds two calls' events
// (one body not UTF-8, one repeated header, answers recorded) and returns
// it with the captures as saved.
func exportStore(t *testing.T) (string, []*agentdb.Capture) {
	t.Helper()
	dir := t.TempDir()
	db, err := agentDB(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	var cs []*agentdb.Capture
	for i, ev := range []string{"call.started", "call.ended", "call.started"} {
		call := fmt.Sprintf("6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c0%d", i/2)
		body := fmt.Appendf(nil, `{"id":"d-%d","event":%q,"occurred_at":"2026-11-22T10:00:0%d+00:00","call":{"call_id":%q}}`, i, ev, i, call)
		c := &agentdb.Capture{ID: fmt.Sprintf("0193a1b2-0000-7000-8000-00000000000%d", i), Source: "tunnel", CreatedAt: t0.Add(time.Duration(i) * time.Second),
			Method: "POST", Path: "/hooks/voice", Query: "a=1&a=2", RequestHeaders: `[["Content-Type","application/json"],["X-Multi","one"],["X-Multi","two"]]`,
			Body: body, Target: "http://127.0.0.1:3000/hooks/voice?a=1&a=2", Duration: -1}
		agent.IndexCapture(c)
		cs = append(cs, c)
	}
	cs = append(cs, &agentdb.Capture{ID: "0193a1b2-0000-7000-8000-000000000009", Source: "tunnel", CreatedAt: t0.Add(time.Minute),
		Method: "PUT", Path: "/bin", RequestHeaders: `[]`, Body: []byte{0xff, 0x00, 0x80, 'x'}, Duration: -1})
	if _, err := db.WriteCaptures(context.Background(), cs, nil); err != nil {
		t.Fatal(err)
	}
	var answers []*agentdb.Capture
	for _, c := range cs[:2] {
		u := *c
		u.Status, u.ResponseStatus, u.Attempts, u.Duration, u.DeliveredAt = agentdb.StatusDelivered, 201, 1, 1500*time.Microsecond, c.CreatedAt.Add(time.Millisecond)
		u.ResponseHeaders, u.ResponseBody = `[["Content-Type","text/plain"]]`, []byte("ok\x00\xff")
		answers = append(answers, &u)
	}
	if _, err := db.WriteCaptures(context.Background(), nil, answers); err != nil {
		t.Fatal(err)
	}
	return dir, cs
}

// An export loaded into an empty store gives back every capture
// byte-exact, marked as imported; a second import adds nothing.
func TestExportImportRoundTrip(t *testing.T) {
	src, cs := exportStore(t)
	file := filepath.Join(t.TempDir(), "calls.jsonl")
	if code, _, stderr := runCmd(t, "export", "--data", src, "-o", file); code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != len(cs)+1 || !strings.Contains(lines[0], `"format":"calltap-export"`) || !strings.Contains(lines[0], `"version":1`) {
		t.Fatalf("export of %d lines, first %s", len(lines), lines[0])
	}
	dst := t.TempDir()
	code, stdout, stderr := runCmd(t, "import", file, "--data", dst)
	if code != 0 || !strings.Contains(stdout, "imported 4 of 4") {
		t.Fatalf("import: %d %s %s", code, stdout, stderr)
	}
	db, err := agentDB(context.Background(), dst)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, want := range cs {
		got, err := db.Capture(context.Background(), want.ID)
		if err != nil {
			t.Fatalf("%s: %v", want.ID, err)
		}
		if !bytes.Equal(got.Body, want.Body) || got.RequestHeaders != want.RequestHeaders || got.Method != want.Method ||
			got.Path != want.Path || got.Query != want.Query || !got.CreatedAt.Equal(want.CreatedAt) || got.Source != agent.SourceImport ||
			got.Event != want.Event || got.CallID != want.CallID {
			t.Errorf("%s came back as %+v", want.ID, got)
		}
	}
	answered, err := db.Capture(context.Background(), cs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if answered.ResponseStatus != 201 || !bytes.Equal(answered.ResponseBody, []byte("ok\x00\xff")) || answered.Duration != 1500*time.Microsecond {
		t.Errorf("the answer came back as %d %q %s", answered.ResponseStatus, answered.ResponseBody, answered.Duration)
	}
	if code, stdout, _ := runCmd(t, "import", file, "--data", dst); code != 0 || !strings.Contains(stdout, "imported 0 of 4") {
		t.Errorf("a second import: %d %s", code, stdout)
	}
	if _, n, err := db.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 10}}); err != nil || n != 4 {
		t.Errorf("%d captures after two imports, %v", n, err)
	}

	// One call only, oldest first.
	code, one, _ := runCmd(t, "export", "--data", src, "--call-id", cs[2].CallID)
	if code != 0 || strings.Count(one, "\n") != 2 || !strings.Contains(one, cs[2].ID) {
		t.Errorf("export of one call: %d\n%s", code, one)
	}
}

// Bad input gets one line, exit 1, and writes nothing.
func TestExportImportRefuseBadInput(t *testing.T) {
	src, cs := exportStore(t)
	out := filepath.Join(t.TempDir(), "x.jsonl")
	for _, args := range [][]string{
		{"export", "--data", src, "--call-id", "no-such-call", "-o", out},
		{"export", "--data", src, "--event", "call.failed", "-o", out},
	} {
		code, _, stderr := runCmd(t, args...)
		if code != 1 || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: %d %q", args, code, stderr)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v wrote %s", args, out)
		}
	}

	good := filepath.Join(t.TempDir(), "good.jsonl")
	if code, _, stderr := runCmd(t, "export", "--data", src, "-o", good); code != 0 {
		t.Fatal(stderr)
	}
	b, _ := os.ReadFile(good)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	dir := t.TempDir()
	for name, tc := range map[string]struct{ content, want string }{
		"malformed line": {strings.Join(append(lines[:3:3], "{not json"), "\n"), "line 4"},
		"newer version":  {strings.Replace(lines[0], `"version":1`, `"version":2`, 1) + "\n" + lines[1], "version 2"},
		"not an export":  {"hello\n", "not a calltap export"},
		"repeated id":    {strings.Join(append(lines[:3:3], lines[1]), "\n"), "line 4: capture " + cs[0].ID + " is already on line 2"},
		"empty":          {"", "empty"},
	} {
		f := filepath.Join(t.TempDir(), "in.jsonl")
		os.WriteFile(f, []byte(tc.content), 0o600)
		code, _, stderr := runCmd(t, "import", f, "--data", dir)
		if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: %d %q, want one line saying %q", name, code, stderr, tc.want)
		}
	}
	db, err := agentDB(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, n, err := db.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 10}}); err != nil || n != 0 {
		t.Errorf("bad imports left %d captures, %v", n, err)
	}
}

// recordingHandler answers {"ok":true} with 200, except call.ended, which
// it answers 500, and records the events it saw in order.
type recordingHandler struct {
	mu     sync.Mutex
	events []string
}

func (h *recordingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var p struct{ Event string }
	json.Unmarshal(b, &p)
	h.mu.Lock()
	h.events = append(h.events, p.Event)
	h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if p.Event == "call.ended" {
		w.WriteHeader(http.StatusInternalServerError)
	}
	io.WriteString(w, `{"ok":true}`)
}

func (h *recordingHandler) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.events...)
}

// A whole call is re-fired in order, each event stored as a replay of its
// original; --expect names every event whose answer did not match, from
// the store or from an export.
func TestReplayCall(t *testing.T) {
	src, cs := exportStore(t)
	// The service tried call.started again: a duplicate of its delivery.
	db, err := agentDB(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	retry := *cs[0]
	retry.ID, retry.CreatedAt = "0193a1b2-0000-7000-8000-000000000008", cs[0].CreatedAt.Add(30*time.Second)
	if _, err := db.WriteCaptures(context.Background(), []*agentdb.Capture{&retry}, nil); err != nil {
		t.Fatal(err)
	}
	db.Close()
	h := &recordingHandler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	call := cs[0].CallID

	code, stdout, stderr := runCmd(t, "replay", "--call", call, "--data", src, "--to", hs.URL, "--time-scale", "0", "--expect", "2xx", "--expect-body-json", "ok=true")
	if code != 1 || !strings.Contains(stdout, "FAIL call.ended") || !strings.Contains(stdout, "answered 500, want 2xx") || !strings.Contains(stdout, "2 replayed, 1 failed") {
		t.Errorf("replay --call: %d\n%s%s", code, stdout, stderr)
	}
	if got := strings.Join(h.seen(), " "); got != "call.started call.ended" {
		t.Errorf("the handler saw %q, want the call's two events once each, in order", got)
	}
	db, err = agentDB(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	replays, _, err := db.Captures(context.Background(), agentdb.CaptureFilter{ReplayOf: cs[0].ID, Page: storage.Page{Limit: 10}})
	db.Close()
	if err != nil || len(replays) != 1 {
		t.Errorf("%d replays stored of the first event, %v", len(replays), err)
	}

	code, stdout, _ = runCmd(t, "replay", "--call", call, "--data", src, "--to", hs.URL, "--time-scale", "0", "--with-retries", "--json")
	var out struct {
		Replayed, Failed int
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &out) != nil || out.Replayed != 3 {
		t.Errorf("--with-retries --json: %d %s", code, stdout)
	}

	file := filepath.Join(t.TempDir(), "call.jsonl")
	if code, _, stderr := runCmd(t, "export", "--data", src, "--call-id", call, "-o", file); code != 0 {
		t.Fatal(stderr)
	}
	code, stdout, stderr = runCmd(t, "replay", "--from", file, "--to", hs.URL, "--time-scale", "0", "--expect", "2xx")
	if code != 1 || !strings.Contains(stdout, "FAIL call.ended") {
		t.Errorf("replay --from: %d\n%s%s", code, stdout, stderr)
	}

	code, _, stderr = runCmd(t, "replay", "--call", "no-such-call", "--data", src, "--to", hs.URL)
	if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no capture of call no-such-call") {
		t.Errorf("unknown call: %d %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "replay", "--call", call, "--expect", "2xy"); code != 2 {
		t.Errorf("a bad --expect: %d %q", code, stderr)
	}
}

// A HAR export is read back by a HAR reader (martian's, a maintained Go
// implementation of HAR 1.2) with every entry byte-exact.
func TestExportHARIsReadByAReader(t *testing.T) {
	src, cs := exportStore(t)
	file := filepath.Join(t.TempDir(), "calls.har")
	if code, _, stderr := runCmd(t, "export", "--data", src, "--format", "har", "-o", file); code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc har.HAR
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("the HAR reader refused the export: %v", err)
	}
	if doc.Log == nil || doc.Log.Version != "1.2" || doc.Log.Creator == nil || doc.Log.Creator.Name != "calltap" || len(doc.Log.Entries) != len(cs) {
		t.Fatalf("log %+v", doc.Log)
	}
	for i, e := range doc.Log.Entries {
		want := cs[i]
		if e.Request == nil || e.Response == nil || e.Request.PostData == nil || e.Response.Content == nil {
			t.Fatalf("entry %d is missing parts: %+v", i, e)
		}
		if e.Request.Method != want.Method || !bytes.Equal([]byte(e.Request.PostData.Text), want.Body) || !e.StartedDateTime.Equal(want.CreatedAt) {
			t.Errorf("entry %d: %s %q at %s, want %s %q at %s", i, e.Request.Method, e.Request.PostData.Text, e.StartedDateTime, want.Method, want.Body, want.CreatedAt)
		}
	}
	first := doc.Log.Entries[0]
	var multi []string
	for _, h := range first.Request.Headers {
		if h.Name == "X-Multi" {
			multi = append(multi, h.Value)
		}
	}
	if strings.Join(multi, ",") != "one,two" || len(first.Request.QueryString) != 2 {
		t.Errorf("headers %v and query %v: repeats lost", first.Request.Headers, first.Request.QueryString)
	}
	if first.Response.Status != 201 || !bytes.Equal(first.Response.Content.Text, []byte("ok\x00\xff")) || first.Time != 1 {
		t.Errorf("response %d %q, time %d", first.Response.Status, first.Response.Content.Text, first.Time)
	}
}

// Progress goes to stderr only when it is a terminal or with --progress:
// a script reading stderr sees nothing else.
func TestExportProgress(t *testing.T) {
	src, cs := exportStore(t)
	code, stdout, stderr := runCmd(t, "export", "--data", src)
	if code != 0 || stderr != "" || strings.Count(stdout, "\n") != len(cs)+1 {
		t.Errorf("export to a pipe: %d, stderr %q", code, stderr)
	}
	code, stdout, stderr = runCmd(t, "export", "--data", src, "--progress")
	if code != 0 || stderr != "calltap export: 4 captures so far\n" || strings.Count(stdout, "\n") != len(cs)+1 {
		t.Errorf("export --progress: %d, stderr %q", code, stderr)
	}
}
