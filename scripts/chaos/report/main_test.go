package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/calltap/calltap/scripts/chaos/history"
	"github.com/calltap/calltap/scripts/chaos/history/historytest"
)

// writeRun saves a one-delivery run in a new folder; lost makes the
// handler never see the delivery its sender was answered 200 for.
func writeRun(t *testing.T, lost bool) string {
	t.Helper()
	dir := t.TempDir()
	const t0 = int64(1_790_000_000_000_000_000)
	if err := history.WriteMeta(dir, history.Meta{Seed: 3, Mode: history.ModeSingle, Minutes: 1,
		Started: t0, Ended: t0 + 60e9, Drained: t0 + 61e9}); err != nil {
		t.Fatal(err)
	}
	body := `{"delivery_id":"d1","copy":1}`
	sends := []history.Send{{Sender: "s", Tunnel: "t", DeliveryID: "d1", Attempt: 1,
		SentAt: t0 + 1e9, AnsweredAt: t0 + 1.02e9, Status: 200, Body: body}}
	copies := []history.Copy{{ReceivedAt: t0 + 1.01e9, Tunnel: "t", DeliveryID: "d1", Status: 200, AnswerBody: body}}
	if lost {
		copies = nil
	}
	store := []history.Capture{{CaptureID: "p1", Tunnel: "t", DeliveryID: "d1", ReceivedAt: t0 + 1.005e9,
		State: "delivered", ResponseStatus: 200}}
	for _, err := range []error{
		historytest.WriteAll(dir, history.SendsFile, sends),
		historytest.WriteAll(dir, history.HandlerFile, copies),
		historytest.WriteAll(dir, history.StoreFile, store),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRecheck re-checks saved runs: a sound one passes (exit 0), one with a
// lost 2xx fails (exit 1), each printing the verdict and writing the page.
func TestRecheck(t *testing.T) {
	for _, tc := range []struct {
		lost    bool
		code    int
		verdict string
	}{
		{false, 0, "chaos: PASS — 0 violations in 1 request, 0 faults (seed 3, single, 1 min)"},
		{true, 1, "chaos: FAIL — 3 violations (1 loss, 1 invented-answer, 1 store-disagrees) in 1 request"},
	} {
		dir := writeRun(t, tc.lost)
		var out, errb bytes.Buffer
		if code := run([]string{dir}, &out, &errb); code != tc.code {
			t.Fatalf("lost=%v: exit %d, want %d; stderr %q", tc.lost, code, tc.code, errb.String())
		}
		page := filepath.Join(dir, "report.html")
		if !strings.HasPrefix(out.String(), tc.verdict) || !strings.Contains(out.String(), "report: "+page) ||
			tc.lost != strings.Contains(out.String(), "\n  loss d1 (Lost2xx) t: answered 200") {
			t.Errorf("lost=%v: printed %q", tc.lost, out.String())
		}
		if b, err := os.ReadFile(page); err != nil || !strings.Contains(string(b), "<svg") {
			t.Errorf("lost=%v: no page at %s (%v)", tc.lost, page, err)
		}
	}
}

// TestUsage: a usage error prints one line and exits 2; a folder that is
// not a run exits 1 naming the problem.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"a", "b"}, {"-x", "a"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 || strings.Count(errb.String(), "\n") != 1 {
			t.Errorf("%q: exit %d, stderr %q", args, code, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{t.TempDir()}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "meta.json") {
		t.Errorf("empty folder: exit %d, stderr %q", code, errb.String())
	}
}
