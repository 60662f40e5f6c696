package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/emulator"
	"github.com/calltap/calltap/inspector/voice/emulator/emulatortest"
	"github.com/calltap/calltap/inspector/voice/service"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// A call whose webhooks never reached the agent is brought in by a
// backfill, each delivery once, byte-exact, oldest first, sent on to the
// handler with the headers given; a second run brings nothing.
func TestBackfillImportsWhatNeverCame(t *testing.T) {
	h := &seen{}
	a := runAgent(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, callID := missedCall(t, ctx, "http://127.0.0.1:1/t/abc/hooks?src=svc")
	env := struct{ Data struct{ CallID string } }{}
	env.Data.CallID = callID

	if _, err := (&Agent{}).Backfill(ctx, c, BackfillOptions{Forward: true}); err == nil {
		t.Error("forwarding without a handler was not refused")
	}
	var progress []BackfillProgress
	res, err := a.Backfill(ctx, c, BackfillOptions{Since: time.Hour, Forward: true, CallID: env.Data.CallID,
		PublicURL: "http://127.0.0.1:1/t/abc",
		Header:    wire.Header{{Name: "X-Secret", Value: "given"}},
		Progress:  func(p BackfillProgress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Listed != 2 || res.Missing != 2 || res.Fetched != 2 || res.Imported != 2 || res.Forwarded != 2 || res.Delivered != 2 || res.Known != 0 || len(res.Items) != 2 {
		t.Fatalf("backfill: %+v", res)
	}
	if last := progress[len(progress)-1]; last.Phase != "done" || last.Imported != 2 || last.Forwarded != 2 || last.Pages < 1 {
		t.Errorf("last progress: %+v", last)
	}
	got := h.all()
	if len(got) != 2 || !strings.HasPrefix(got[0], "POST /base/hooks?src=svc given ") || !strings.Contains(got[0], `"call.started"`) {
		t.Errorf("the handler got %q", got)
	}
	for _, it := range res.Items {
		cp, err := a.store.Capture(ctx, it.CaptureID)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := c.Delivery(ctx, it.DeliveryID)
		if err != nil {
			t.Fatal(err)
		}
		if cp.Source != SourceBackfill || cp.Path != "/hooks" || cp.Query != "src=svc" || !bytes.Equal(cp.Body, rec.Payload) ||
			cp.CallID != env.Data.CallID || cp.ResponseStatus != http.StatusAccepted || it.ResponseStatus == nil || *it.ResponseStatus != http.StatusAccepted {
			t.Errorf("capture of %s: source %s, %s?%s, call %s, answered %d", it.DeliveryID, cp.Source, cp.Path, cp.Query, cp.CallID, cp.ResponseStatus)
		}
	}
	again, err := a.Backfill(ctx, c, BackfillOptions{Forward: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.Imported != 0 || again.Known != 2 || again.Missing != 0 || len(h.all()) != 2 {
		t.Errorf("second backfill: %+v", again)
	}
	_, n, err := a.store.Captures(ctx, agentdb.CaptureFilter{})
	if err != nil || n != 2 {
		t.Errorf("%d captures after two runs, want 2 (%v)", n, err)
	}
}

// missedCall has the emulator place a call whose two webhooks go to url,
// where nothing listens, and waits until the service has given up on them.
func missedCall(t *testing.T, ctx context.Context, url string) (*service.Client, string) {
	t.Helper()
	e := emulatortest.Start(t, func(cfg *emulator.Config) { cfg.TimeScale = 0.0005 }, nil)
	c, err := service.New(e.Base, emulatortest.Key)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"to_number": "+12025550143", "event_webhook_url": url, "scenario": "failed:no_answer"})
	req, _ := http.NewRequest("POST", e.Base+"calls/dispatch/", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+emulatortest.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var env struct {
		Data struct {
			CallID string `json:"call_id"`
		} `json:"data"`
	}
	if resp.StatusCode != 201 || json.Unmarshal(raw, &env) != nil {
		t.Fatalf("dispatch: %d %s", resp.StatusCode, raw)
	}
	polltest.Until(t, 30*time.Second, func() bool {
		ds, err := c.Deliveries(ctx, service.Filter{CallID: env.Data.CallID}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Status == "pending" {
				return false
			}
		}
		return len(ds) == 2
	}, "the call's deliveries to settle")
	return c, env.Data.CallID
}

// A backfill with no public URL given takes the connected tunnel's, and
// one forwarded to a handler that does not answer says why, with no
// answer's status.
func TestBackfillToADeadHandler(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hs := httptest.NewServer(http.NotFoundHandler())
	dead := hs.URL
	hs.Close()
	d := openDisk(t)
	a, err := New(Config{Store: d.store, ForwardTo: dead, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); a.Run(runCtx) }()
	defer func() { stop(); <-ran }()
	a.SetConnState(tunnel.ConnState{State: tunnel.StateConnected, Hello: &wire.Hello{PublicURL: "http://127.0.0.1:1/custom"}})
	c, _ := missedCall(t, ctx, "http://127.0.0.1:1/custom/hooks")
	res, err := a.Backfill(ctx, c, BackfillOptions{Forward: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Imported != 2 || res.Forwarded != 2 || res.Delivered != 0 {
		t.Fatalf("backfill: %+v", res)
	}
	for _, it := range res.Items {
		if it.ResponseStatus != nil || it.Error == "" {
			t.Errorf("%s forwarded to a dead handler: status %v, error %q", it.DeliveryID, it.ResponseStatus, it.Error)
		}
		cp, err := a.store.Capture(ctx, it.CaptureID)
		if err != nil {
			t.Fatal(err)
		}
		if cp.Path != "/hooks" {
			t.Errorf("captured at %s, want the path after the tunnel's public URL", cp.Path)
		}
	}
}
