package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
)

func runTrigger(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := cmdTrigger(ctx, args, Stdio{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

func TestTriggerUsage(t *testing.T) {
	for _, args := range [][]string{
		{"call.ended"},
		{"--to", "http://127.0.0.1:1"},
		{"call.ende", "--to", "http://127.0.0.1:1"},
		{"call.ended", "call.started", "--to", "http://127.0.0.1:1"},
		{"--flow", "sideways", "--to", "http://127.0.0.1:1"},
		{"call.ended", "--to", "http://127.0.0.1:1", "--header", "nocolon"},
		{"call.ended", "--to", "http://127.0.0.1:1", "--set", "novalue"},
		{"call.ended", "--to", "http://127.0.0.1:1", "--outcome-code", "busy"},
		{"call.ended", "--to", "ftp://x"},
	} {
		code, _, stderr := runTrigger(t, args...)
		if code != 2 || stderr == "" || strings.Count(strings.TrimRight(stderr, "\n"), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
	if code, stdout, _ := runTrigger(t, "-h"); code != 0 || !strings.Contains(stdout, "--flow") {
		t.Errorf("-h: %d %q", code, stdout)
	}
}

func TestTriggerSendsAFlow(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	contact := filepath.Join(t.TempDir(), "contact.json")
	os.WriteFile(contact, []byte(`{"id":"9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d","name":"Ana Ruiz","phone":"+34600000001","email":"ana@example.com","custom_fields":{"city":"Madrid"},"tier":"gold"}`), 0o600)

	code, stdout, stderr := runTrigger(t, "--flow", "completed", "--to", srv.URL+"/hook", "--contact-file", contact,
		"--set", "call.variables.lead_id=EZ-1", "--header", "Authorization: Bearer X", "--duplicate", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res struct {
		CallID     string `json:"call_id"`
		Deliveries []struct {
			Event   string          `json:"event"`
			Status  int             `json:"status"`
			Copy    int             `json:"copy"`
			Payload json.RawMessage `json:"payload"`
		} `json:"deliveries"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(res.Deliveries) != 10 || len(bodies) != 10 {
		t.Fatalf("%d deliveries, %d received", len(res.Deliveries), len(bodies))
	}
	for i, b := range bodies {
		var p callevent.Payload
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		if p.Call.CallID != res.CallID || p.Call.Contact.Name != "Ana Ruiz" || string(p.Call.Contact.Extra["tier"]) != `"gold"` ||
			p.Call.Variables["lead_id"] != "EZ-1" || auth[i] != "Bearer X" || res.Deliveries[i].Status != 202 {
			t.Errorf("%d: %+v %v", i, p.Call, auth[i])
		}
	}

	// A handler that fails makes the command fail, with a table on stdout.
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }))
	defer bad.Close()
	code, stdout, stderr = runTrigger(t, "call.failed", "--outcome-code", "no_answer", "--to", bad.URL)
	if code != 1 || !strings.Contains(stdout, "call.failed") || !strings.Contains(stdout, "503") || !strings.Contains(stderr, "1 of 1") {
		t.Errorf("exit %d\n%s\n%s", code, stdout, stderr)
	}
}
