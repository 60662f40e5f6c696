package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/voice/trigger"
	"github.com/calltap/calltap/storage/agentdb"
)

// refStore holds a delivery received twice (the service's retry: an
// original and its duplicate) and another delivery, with ids that share
// a prefix two by two: 01aa… alone, 01bb… and 01bc… together.
func refStore(t *testing.T) (dir string, orig, dup, other string) {
	t.Helper()
	dir = t.TempDir()
	db, err := agentDB(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	orig, dup, other = "01aa0000-0000-7000-8000-000000000001", "01bb0000-0000-7000-8000-000000000002", "01bc0000-0000-7000-8000-000000000003"
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	var cs []*agentdb.Capture
	for i, id := range []string{orig, dup, other} {
		delivery := "dlv-1"
		if id == other {
			delivery = "dlv-2"
		}
		body := fmt.Sprintf(`{"id":%q,"event":"call.started","occurred_at":"2026-11-22T10:00:00+00:00","call":{"call_id":"c-1"}}`, delivery)
		c := &agentdb.Capture{ID: id, Source: "tunnel", CreatedAt: t0.Add(time.Duration(i) * time.Second), Method: "POST", Path: "/hooks",
			RequestHeaders: `[]`, Body: []byte(body), Target: "http://127.0.0.1:1/hooks", Duration: -1}
		agent.IndexCapture(c)
		if id == dup {
			c.DuplicateOf = orig
		}
		cs = append(cs, c)
	}
	if _, err := db.WriteCaptures(context.Background(), cs, nil); err != nil {
		t.Fatal(err)
	}
	return dir, orig, dup, other
}

// requests --id, keep and delete take a capture id, a unique prefix of one
// or a delivery id; an ambiguous prefix lists its choices; keep says what
// it kept and let go.
func TestCommandsTakeAnyID(t *testing.T) {
	dir, orig, dup, other := refStore(t)
	code, out, stderr := runCmd(t, "requests", "--data", dir, "--id", "dlv-1")
	if code != 0 || !strings.Contains(out, orig) || !strings.Contains(out, dup) || strings.Contains(out, other) {
		t.Fatalf("requests --id DELIVERY: %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr := runCmd(t, "requests", "--data", dir, "--id", "01aa"); code != 0 || !strings.Contains(out, orig) || strings.Contains(out, dup) || strings.Contains(out, other) {
		t.Fatalf("requests --id PREFIX: %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr := runCmd(t, "requests", "--data", dir, "--id", "01b"); code != 1 || out != "" ||
		!strings.Contains(stderr, "give more") || !strings.Contains(stderr, dup) || !strings.Contains(stderr, other) {
		t.Fatalf("requests --id AMBIGUOUS: %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr := runCmd(t, "keep", "--data", dir, "dlv-1"); code != 0 || !strings.HasPrefix(out, "Kept") ||
		!strings.Contains(out, orig) || !strings.Contains(out, dup) {
		t.Fatalf("keep DELIVERY: %d %q %q", code, out, stderr)
	}
	if code, out, stderr := runCmd(t, "keep", "--data", dir, "--off", "01bb"); code != 0 || !strings.HasPrefix(out, "Let go") || !strings.Contains(out, dup) {
		t.Fatalf("keep --off PREFIX: %d %q %q", code, out, stderr)
	}
	if code, out, stderr := runCmd(t, "requests", "--data", dir, "--json", "--id", orig); code != 0 || !strings.Contains(out, `"keep":true`) {
		t.Fatalf("the kept capture is not marked kept: %d %s %s", code, out, stderr)
	}
	if code, out, _ := runCmd(t, "delete", "--data", dir, "--yes", "dlv-1"); code != 0 || !strings.Contains(out, "Deleted 2 capture(s)") || !strings.Contains(out, "deleted them all") {
		t.Fatalf("delete DELIVERY: %d %q", code, out)
	}
	if code, out, stderr := runCmd(t, "delete", "--data", dir, "--yes", "01bc"); code != 0 || !strings.Contains(out, "Deleted 1 capture(s)") {
		t.Fatalf("delete PREFIX: %d %q %q", code, out, stderr)
	}
}

// Deleting an id twice says once, on one stream, that it matched nothing;
// without --yes on a standard input that is no terminal (here /dev/null,
// a character device a prompt used to answer itself from) delete exits 2
// with "add --yes" and deletes nothing.
func TestDeleteSaysWhatItDid(t *testing.T) {
	dir, orig, _, _ := refStore(t)
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	var out, errb syncBuffer
	if code := run(context.Background(), []string{"delete", "--data", dir, orig}, Stdio{In: null, Out: &out, Err: &errb}); code != 2 ||
		out.String() != "" || !strings.Contains(errb.String(), "add --yes") || strings.Count(errb.String(), "\n") != 1 {
		t.Fatalf("delete </dev/null: exit %d, stdout %q, stderr %q; want 2 and one line saying add --yes", code, out.String(), errb.String())
	}
	if code, out, _ := runCmd(t, "requests", "--data", dir, "--id", orig); code != 0 || !strings.Contains(out, orig) {
		t.Fatal("a refused delete deleted")
	}
	if code, out, stderr := runCmd(t, "delete", "--data", dir, "--yes", orig); code != 0 || !strings.Contains(out, "Deleted 1 capture(s)") || stderr != "" {
		t.Fatalf("delete: %d %q %q", code, out, stderr)
	}
	code, out2, stderr := runCmd(t, "delete", "--data", dir, "--yes", orig)
	if code != 1 || out2 != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, orig) || !strings.Contains(stderr, "not found") {
		t.Fatalf("delete again: exit %d, stdout %q, stderr %q; want 1 and one line on stderr only", code, out2, stderr)
	}
}

// The delivery id trigger prints works in replay: trigger shows the
// capture id beside it, and replay of a delivery sent twice takes the
// original, saying so.
func TestTriggerIDsPasteIntoReplay(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	dir := t.TempDir()
	dev := start(t, "dev", "--forward-to", h.URL, "--listen", freeAddr(t), "--inspect", "", "--data", dir)
	url := tunnelURL(t, dev)
	code, out, stderr := runCmd(t, "trigger", "call.started", "--duplicate", "--to", url, "--data", dir, "--json")
	if code != 0 {
		t.Fatalf("trigger: %d %s", code, stderr)
	}
	var res trigger.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Deliveries) != 2 || res.Deliveries[0].CaptureID == "" || res.Deliveries[1].CaptureID == "" || res.Deliveries[0].CaptureID == res.Deliveries[1].CaptureID {
		t.Fatalf("trigger did not give each copy its capture id: %+v", res.Deliveries)
	}
	first := res.Deliveries[0]
	code, out, stderr = runCmd(t, "trigger", "call.ended", "--to", url, "--data", dir)
	if code != 0 || !strings.Contains(out, "CAPTURE ID") {
		t.Fatalf("trigger's table has no capture id column: %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCmd(t, "replay", "--data", dir, first.DeliveryID)
	if code != 0 || !strings.HasPrefix(out, "replayed "+first.CaptureID+" as ") || !strings.Contains(stderr, "replaying the original, "+first.CaptureID) {
		t.Fatalf("replay DELIVERY: %d\nstdout %s\nstderr %s", code, out, stderr)
	}
}
