package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/inspector/voice/trigger"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
)

// The client's secret, as the documentation has the service send it.
const clientSecret = "Bearer cs_live_7Qm2xV9pL4"

// personalValues are what personalStore's calls carry of a person.
var personalValues = []string{"Margarethe Quist", "+442071838750", "m.quist@quistfamily.example.org",
	"c0ffee00-1111-4222-8333-444455556666", "Llanfairpwll", "CRM-88213", "+14155550123"}

// personalStore makes a data directory holding a whole call as the
// service delivers it (its events, a contact, numbers, variables, media
// links), each request with the client's secret in Authorization and a
// cookie, each answered with a Set-Cookie.
func personalStore(t *testing.T) string {
	t.Helper()
	events, _, err := trigger.Build(trigger.Options{URL: "http://127.0.0.1:1/hooks/voice", Flow: callevent.FlowCompleted, Spec: callevent.CallSpec{
		From: "+14155550123", To: "+442071838750",
		Contact: callevent.Contact{ID: "c0ffee00-1111-4222-8333-444455556666", Name: "Margarethe Quist", Phone: "+442071838750",
			Email: "m.quist@quistfamily.example.org", CustomFields: map[string]any{"city": "Llanfairpwll"}},
		Variables: map[string]any{"crm_ref": "CRM-88213"},
		Start:     time.Now().Add(-time.Hour),
	}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	db, err := agentDB(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var cs, answers []*agentdb.Capture
	for i, e := range events {
		c := &agentdb.Capture{ID: fmt.Sprintf("0193a1b2-0000-7000-8000-0000000001%02d", i), Source: "tunnel", CreatedAt: time.Now().Add(time.Duration(i-10) * time.Second),
			Method: "POST", Path: "/hooks/voice",
			RequestHeaders: fmt.Sprintf(`[["Content-Type","application/json"],["Authorization",%q],["Cookie","session=abc123"]]`, clientSecret),
			Body:           e.Body, Target: "http://127.0.0.1:3000/hooks/voice", Duration: -1}
		agent.IndexCapture(c)
		cs = append(cs, c)
		u := *c
		u.Status, u.ResponseStatus, u.Attempts, u.Duration, u.DeliveredAt = agentdb.StatusDelivered, 200, 1, time.Millisecond, c.CreatedAt.Add(time.Millisecond)
		u.ResponseHeaders, u.ResponseBody = `[["Set-Cookie","handler_session=zz9"]]`, []byte(`{"received":true}`)
		answers = append(answers, &u)
	}
	if _, err := db.WriteCaptures(context.Background(), cs, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := db.WriteCaptures(context.Background(), nil, answers); err != nil {
		t.Fatal(err)
	}
	return dir
}

func exportHeader(t *testing.T, b []byte) inspector.ExportHeader {
	t.Helper()
	first, _, _ := bytes.Cut(b, []byte("\n"))
	var h inspector.ExportHeader
	if err := json.Unmarshal(first, &h); err != nil || h.Format != inspector.ExportFormat {
		t.Fatalf("first line %q is not an export header: %v", first, err)
	}
	return h
}

// An export masks secret headers' values by default, in requests and
// answers, in both formats, and says so; --include-secrets keeps them; a
// masked export replays with the secret given again by --header.
func TestExportMasksSecrets(t *testing.T) {
	dir := personalStore(t)
	secrets := []string{clientSecret, "session=abc123", "handler_session=zz9"}

	code, jsonl, stderr := runCmd(t, "export", "--data", dir)
	if code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	for _, s := range secrets {
		if strings.Contains(jsonl, s) {
			t.Errorf("the JSONL export holds the secret %q", s)
		}
	}
	if !strings.Contains(jsonl, inspector.MaskedValue) {
		t.Errorf("the JSONL export shows no %s", inspector.MaskedValue)
	}
	h := exportHeader(t, []byte(jsonl))
	for _, name := range []string{"Authorization", "Cookie", "Set-Cookie", "X-Api-Key"} {
		found := false
		for _, m := range h.MaskedHeaders {
			found = found || strings.EqualFold(m, name)
		}
		if !found {
			t.Errorf("the first line's masked_headers %q lack %s", h.MaskedHeaders, name)
		}
	}

	code, har, stderr := runCmd(t, "export", "--data", dir, "--format", "har")
	if code != 0 {
		t.Fatalf("export --format har: %d %s", code, stderr)
	}
	for _, s := range secrets {
		if strings.Contains(har, s) {
			t.Errorf("the HAR export holds the secret %q", s)
		}
	}
	var doc struct {
		Log struct {
			Comment string `json:"comment"`
		} `json:"log"`
	}
	if err := json.Unmarshal([]byte(har), &doc); err != nil || !strings.Contains(doc.Log.Comment, "Authorization") {
		t.Errorf("the HAR's comment %q does not say Authorization was masked (%v)", doc.Log.Comment, err)
	}

	code, kept, _ := runCmd(t, "export", "--data", dir, "--include-secrets")
	if code != 0 || !strings.Contains(kept, clientSecret) || !strings.Contains(kept, "handler_session=zz9") {
		t.Errorf("export --include-secrets: exit %d, the secrets kept: %v", code, strings.Contains(kept, clientSecret))
	}
	if h := exportHeader(t, []byte(kept)); len(h.MaskedHeaders) != 0 {
		t.Errorf("export --include-secrets names masked headers %q", h.MaskedHeaders)
	}

	// A handler that checks the secret, as integrations do.
	handler := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != clientSecret {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Write([]byte(`{"received":true}`))
	}))
	defer handler.Close()
	file := filepath.Join(t.TempDir(), "masked.jsonl")
	if err := os.WriteFile(file, []byte(jsonl), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runCmd(t, "replay", "--from", file, "--to", handler.URL, "--expect", "2xx"); code == 0 {
		t.Errorf("replay of a masked export without the secret passed --expect 2xx: %s %s", out, errOut)
	}
	if code, out, errOut := runCmd(t, "replay", "--from", file, "--to", handler.URL, "--header", "Authorization: "+clientSecret, "--expect", "2xx"); code != 0 {
		t.Errorf("replay --header 'Authorization: …' of a masked export: exit %d\n%s%s", code, out, errOut)
	}
}

// export --redact writes no original value of a personal field anywhere;
// the file still imports, replays against the sample handler with every
// answer 2xx, and every payload passes the contract checks.
func TestExportRedactedFixtureStillWorks(t *testing.T) {
	dir := personalStore(t)
	_, plain, _ := runCmd(t, "export", "--data", dir)
	for _, v := range personalValues {
		if !strings.Contains(plain, v) {
			t.Fatalf("the store does not hold %q: the test would mean nothing", v)
		}
	}
	file := filepath.Join(t.TempDir(), "fixture.jsonl")
	if code, _, stderr := runCmd(t, "export", "--data", dir, "--redact", "-o", file); code != 0 {
		t.Fatalf("export --redact: %d %s", code, stderr)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range personalValues {
		if bytes.Contains(b, []byte(v)) {
			t.Errorf("the redacted export holds %q", v)
		}
	}
	if h := exportHeader(t, b); len(h.RedactedPaths) == 0 {
		t.Error("the first line names no redacted path")
	}
	// Every payload passes the contract checks.
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	sc.Scan() // the header
	n := 0
	for sc.Scan() {
		var line struct {
			Payload json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || len(line.Payload) == 0 {
			t.Fatalf("line %d: no payload (%v)", n+2, err)
		}
		for _, f := range callevent.Check(line.Payload) {
			if f.Severity == "error" {
				t.Errorf("line %d: contract check: %s %s: %s", n+2, f.Code, f.Path, f.Message)
			}
		}
		n++
	}
	if want := strings.Count(plain, "\n") - 1; n != want {
		t.Fatalf("%d captures in the redacted export, want the call's %d", n, want)
	}
	// It imports into an empty store.
	if code, _, stderr := runCmd(t, "import", "--data", t.TempDir(), file); code != 0 {
		t.Errorf("import of the redacted export: %d %s", code, stderr)
	}
	// It replays against the sample handler, every answer 2xx.
	bin := filepath.Join(t.TempDir(), "samplehandler")
	if out, err := exec.Command("go", "build", "-o", bin, "../../scripts/samplehandler").CombinedOutput(); err != nil {
		t.Fatalf("go build samplehandler: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	h := exec.Command(bin, "--listen", addr)
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Process.Kill(); h.Wait() })
	polltest.Until(t, 60*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, "the sample handler did not come up")
	if code, out, errOut := runCmd(t, "replay", "--from", file, "--to", "http://"+addr+"/hooks/voice", "--expect", "2xx"); code != 0 {
		t.Errorf("replay --from the redacted export --expect 2xx: exit %d\n%s%s", code, out, errOut)
	}
}
