package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/emulator"
	"github.com/calltap/calltap/inspector/voice/emulator/emulatortest"
	"github.com/calltap/calltap/inspector/voice/service"
	"github.com/calltap/calltap/relay/polltest"
)

// runFn runs one command function with captured output.
func runFn(t *testing.T, fn func(context.Context, []string, Stdio) int, args ...string) (int, string, string) {
	t.Helper()
	var out, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := fn(ctx, args, Stdio{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

// svcEmulator starts the emulator on loopback and returns its base URL.
func svcEmulator(t *testing.T) string {
	t.Helper()
	return emulatortest.Start(t, func(c *emulator.Config) { c.TimeScale = 0.0005 }, nil).Base
}

// isolate points the config file and the environment at nothing.
func isolate(t *testing.T) string {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	t.Setenv("CALLTAP_BASE_URL", "")
	t.Setenv("CALLTAP_API_KEY", "")
	return dir
}

func oneLine(t *testing.T, what, s string) {
	t.Helper()
	if s == "" || strings.Count(strings.TrimRight(s, "\n"), "\n") != 0 {
		t.Errorf("%s: want one line on stderr, got %q", what, s)
	}
}

func TestServiceAndBackfillUsage(t *testing.T) {
	dir := isolate(t)
	bad := filepath.Join(dir, "bad.conf")
	os.WriteFile(bad, []byte("base_url = http://127.0.0.1:1/api/v1/ext/\napikey = x\n"), 0o600)
	for _, c := range []struct {
		fn   func(context.Context, []string, Stdio) int
		args []string
	}{
		{cmdService, nil},
		{cmdService, []string{"frobnicate"}},
		{cmdService, []string{"deliveries", "extra"}},
		{cmdService, []string{"deliveries", "--since", "-1h"}},
		{cmdService, []string{"deliveries"}},                                                 // no base URL anywhere
		{cmdService, []string{"deliveries", "--base-url", "http://127.0.0.1:1/api/v1/ext/"}}, // no key
		{cmdService, []string{"deliveries", "--base-url", "ftp://x", "--config", bad}},
		{cmdService, []string{"deliveries", "--config", bad}},
		{cmdService, []string{"deliveries", "--config", filepath.Join(dir, "missing")}},
		{cmdService, []string{"replay"}},
		{cmdService, []string{"replay", "a", "b"}},
		{cmdService, []string{"delivery", "x", "--payload", "--json"}},
		{cmdBackfill, []string{"extra"}},
		{cmdBackfill, []string{"--since", "-2h"}},
		{cmdBackfill, []string{"--forward"}},
		{cmdBackfill, []string{"--forward-to", "ftp://x"}},
		{cmdBackfill, []string{"--header", "nocolon"}},
		{cmdBackfill, []string{"--bogus"}},
		{cmdBackfill, []string{"--data", t.TempDir()}}, // no base URL
	} {
		code, _, stderr := runFn(t, c.fn, c.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", c.args, code, stderr)
		}
		oneLine(t, strings.Join(c.args, " "), stderr)
	}
	for _, args := range [][]string{{"-h"}, {"deliveries", "-h"}, {"delivery", "-h"}, {"replay", "-h"}} {
		code, stdout, _ := runFn(t, cmdService, args...)
		if code != 0 || !strings.Contains(stdout, "Usage:") || !strings.Contains(stdout, "CALLTAP_API_KEY") {
			t.Errorf("service %v: exit %d, %q", args, code, stdout)
		}
	}
	if code, stdout, _ := runFn(t, cmdBackfill, "-h"); code != 0 || !strings.Contains(stdout, "--forward-to") || !strings.Contains(stdout, "config") {
		t.Errorf("backfill -h: exit %d, %q", code, stdout)
	}
}

// dispatchTo starts a call on the emulator that delivers to url.
func dispatchTo(t *testing.T, base, url, scenario string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"to_number": "+12025550143", "event_webhook_url": url, "scenario": scenario})
	req, _ := http.NewRequest("POST", base+"calls/dispatch/", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer test_key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env struct {
		Data struct {
			CallID string `json:"call_id"`
		} `json:"data"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if json.Unmarshal(raw, &env); resp.StatusCode != 201 {
		t.Fatalf("dispatch: %d %s", resp.StatusCode, raw)
	}
	return env.Data.CallID
}

func TestServiceCommandsAgainstTheEmulator(t *testing.T) {
	dir := isolate(t)
	base := svcEmulator(t)

	// The key and address from the config file.
	conf := filepath.Join(dir, "calltap", "config")
	os.MkdirAll(filepath.Dir(conf), 0o700)
	os.WriteFile(conf, []byte("# test\nbase_url = "+base+"\napi_key = \"test_key\"\n"), 0o600)

	// A laptop that is off: nothing listens where the service delivers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	callID := dispatchTo(t, base, dead+"/t/0123abcd/hooks?src=svc", "failed:busy")
	var ds struct {
		Count   int                `json:"count"`
		Results []service.Delivery `json:"results"`
	}
	polltest.Until(t, 20*time.Second, func() bool {
		code, stdout, stderr := runFn(t, cmdService, "deliveries", "--call-id", callID, "--json")
		if code != 0 {
			t.Fatalf("deliveries: %d %s", code, stderr)
		}
		ds.Results = nil
		json.Unmarshal([]byte(stdout), &ds)
		return ds.Count == 2 && ds.Results[0].Status == "failed" && ds.Results[1].Status == "failed"
	}, "the busy call's deliveries did not both fail")

	code, stdout, _ := runFn(t, cmdService, "deliveries", "--call-id", callID)
	if code != 0 || !strings.Contains(stdout, ds.Results[0].ID) || !strings.Contains(stdout, "call.failed") || !strings.HasSuffix(stdout, "2 deliveries\n") {
		t.Errorf("deliveries table: %d %q", code, stdout)
	}
	code, payload, _ := runFn(t, cmdService, "delivery", ds.Results[0].ID, "--payload")
	if code != 0 || !json.Valid([]byte(payload)) || !strings.Contains(payload, `"id":"`+ds.Results[0].ID+`"`) {
		t.Errorf("delivery --payload: %d %q", code, payload)
	}

	// A handler that is up now; backfill brings both events to it.
	var mu sync.Mutex
	var got []string
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.URL.RequestURI()+" "+string(b))
		mu.Unlock()
	}))
	defer h.Close()
	data := t.TempDir()
	code, stdout, stderr := runFn(t, cmdBackfill, "--since", "1h", "--forward-to", h.URL, "--data", data, "--json")
	if code != 0 {
		t.Fatalf("backfill: %d %s", code, stderr)
	}
	var sum struct{ Listed, Imported, Forwarded, Delivered, Known int }
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil || sum.Imported != 2 || sum.Forwarded != 2 || sum.Delivered != 2 {
		t.Fatalf("backfill --json: %s", stdout)
	}
	mu.Lock()
	if len(got) != 2 || !strings.HasPrefix(got[0], "/hooks?src=svc {") || !strings.Contains(got[0], `"call.started"`) || !strings.Contains(got[1], `"call.failed"`) {
		t.Errorf("the handler got %q", got)
	}
	mu.Unlock()
	code, stdout, _ = runFn(t, cmdBackfill, "--since", "1h", "--data", data)
	if code != 0 || !strings.Contains(stdout, "2 deliveries from the last 1h: 2 already here, 0 imported") {
		t.Errorf("second backfill: %d %q", code, stdout)
	}
	code, stdout, _ = runCmd(t, "requests", "--data", data, "--json")
	if code != 0 || strings.Count(stdout, `"source":"backfill"`) != 2 {
		t.Errorf("requests after backfill: %d %s", code, stdout)
	}

	code, stdout, _ = runFn(t, cmdService, "replay", ds.Results[0].ID)
	if code != 0 || stdout != "replay of delivery "+ds.Results[0].ID+" queued (status pending)\n" {
		t.Errorf("replay: %d %q", code, stdout)
	}

	// A key from the environment wins over the file; a refused key is one
	// line and exit 1.
	t.Setenv("CALLTAP_API_KEY", "wrong")
	code, _, stderr = runFn(t, cmdService, "deliveries")
	if code != 1 || stderr != "calltap service deliveries: the API key was refused (401): check CALLTAP_API_KEY or api_key in the config file\n" {
		t.Errorf("wrong key: %d %q", code, stderr)
	}
	t.Setenv("CALLTAP_API_KEY", "ro_key")
	code, _, stderr = runFn(t, cmdService, "replay", ds.Results[0].ID)
	if code != 1 || !strings.Contains(stderr, "(403") || !strings.Contains(stderr, "webhooks:write") {
		t.Errorf("read-only key replays: %d %q", code, stderr)
	}
	oneLine(t, "403", stderr)
	code, _, stderr = runFn(t, cmdService, "delivery", "8a1f6a9e-0000-4000-8000-000000000000")
	if code != 1 || stderr != "calltap service delivery: delivery 8a1f6a9e-0000-4000-8000-000000000000 not found (404)\n" {
		t.Errorf("unknown delivery: %d %q", code, stderr)
	}
	code, _, stderr = runFn(t, cmdService, "deliveries", "--base-url", dead+"/api/v1/ext/")
	if code != 1 || !strings.Contains(stderr, "cannot reach the service at "+dead+"/api/v1/ext/") {
		t.Errorf("service down: %d %q", code, stderr)
	}
	oneLine(t, "network", stderr)

	// A config file others can read draws a warning.
	t.Setenv("CALLTAP_API_KEY", "")
	os.Chmod(conf, 0o644)
	if code, _, stderr = runFn(t, cmdService, "deliveries", "--call-id", callID); code != 0 || !strings.Contains(stderr, "chmod 600") {
		t.Errorf("readable config: %d %q", code, stderr)
	}
}
