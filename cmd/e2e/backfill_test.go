package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/inspector/voice/emulator"
	"github.com/calltap/calltap/inspector/voice/emulator/emulatortest"
	"github.com/calltap/calltap/inspector/voice/service"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

const bfKey = emulatortest.Key // webhooks:read and webhooks:write on every test emulator

// bfEmulator starts the voice service emulator with a small time scale and
// http webhooks allowed (the relay here is plain HTTP), and returns it with
// a client of its API.
func bfEmulator(t *testing.T, scale float64) (base string, c *service.Client) {
	t.Helper()
	e := emulatortest.Start(t, func(cfg *emulator.Config) { cfg.TimeScale = scale }, nil)
	c, err := service.New(e.Base, bfKey)
	if err != nil {
		t.Fatal(err)
	}
	return e.Base, c
}

// bfDispatch starts a call on the emulator with the given parameters.
func bfDispatch(t *testing.T, base string, params map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(params)
	req, _ := http.NewRequest("POST", base+"calls/dispatch/", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+bfKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env struct {
		Data struct {
			CallID string `json:"call_id"`
		} `json:"data"`
	}
	if resp.StatusCode != 201 || json.Unmarshal(raw, &env) != nil || env.Data.CallID == "" {
		t.Fatalf("dispatch: %d %s", resp.StatusCode, raw)
	}
	return env.Data.CallID
}

// bfHandler is the developer's local handler: it keeps every request and
// answers 500 under /fail, 200 elsewhere.
type bfHandler struct {
	*httptest.Server
	mu  sync.Mutex
	got []bfRequest // guarded by mu
}

type bfRequest struct {
	uri    string
	body   []byte
	header http.Header
	event  string
	callID string
}

func newBFHandler(t *testing.T) *bfHandler {
	h := &bfHandler{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Event string `json:"event"`
			Call  struct {
				CallID string `json:"call_id"`
			} `json:"call"`
		}
		json.Unmarshal(body, &p)
		h.mu.Lock()
		h.got = append(h.got, bfRequest{uri: r.URL.RequestURI(), body: body, header: r.Header.Clone(), event: p.Event, callID: p.Call.CallID})
		h.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/fail") {
			w.WriteHeader(500)
			return
		}
		w.WriteHeader(200)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *bfHandler) forCall(callID string) []bfRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []bfRequest
	for _, r := range h.got {
		if r.callID == callID {
			out = append(out, r)
		}
	}
	return out
}

func bfCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// settled waits until every delivery of a call exists (want of them) and
// none is pending any more.
func settled(t *testing.T, ctx context.Context, c *service.Client, callID string, want int) []service.Delivery {
	t.Helper()
	var ds []service.Delivery
	polltest.Until(t, 30*time.Second, func() bool {
		var err error
		ds, err = c.Deliveries(ctx, service.Filter{CallID: callID}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != want {
			return false
		}
		for _, d := range ds {
			if d.Status == "pending" {
				return false
			}
		}
		return true
	}, "the deliveries of call "+callID+" to settle")
	return ds
}

func captures(t *testing.T, ctx context.Context, db *agentdb.AgentStore, f agentdb.CaptureFilter) []*agentdb.Capture {
	t.Helper()
	f.Limit = 1000
	rows, _, err := db.Captures(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

var completedEvents = []string{"call.started", "call.connected", "call.ended", "call.recording_available", "call.analysis_completed"}

// The agent is offline and the relay refuses instead of queueing, so the
// service spends its retries on 503s and gives up. A backfill then brings
// every delivery in, exactly once, and a second run brings nothing.
func TestBackfillAfterTheAgentWasOffline(t *testing.T) {
	t.Parallel()
	ctx := bfCtx(t)
	h := newBFHandler(t)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) { c.Offline = relay.OfflineReject }})
	base, c := bfEmulator(t, 0.0005)

	// While online, a call comes through the tunnel as usual.
	online := bfDispatch(t, base, map[string]any{"to_number": "+12025550143", "event_webhook_url": st.TunnelURL + "/hooks/voice", "scenario": "failed:busy"})
	settled(t, ctx, c, online, 2)
	polltest.Until(t, 10*time.Second, func() bool {
		return len(captures(t, ctx, st.AgentDB, agentdb.CaptureFilter{CallID: online})) == 2
	}, "the online call's two events in the store")

	// The laptop closes; the service's attempts get 503 until it gives up.
	st.StopAgent()
	offline := bfDispatch(t, base, map[string]any{
		"to_number": "+12025550143", "event_webhook_url": st.TunnelURL + "/hooks/voice?src=svc",
		"event_webhook_headers": map[string]string{"Authorization": "Bearer client-secret"},
	})
	missed := settled(t, ctx, c, offline, len(completedEvents))
	for _, d := range missed {
		if d.Status != "failed" || d.Attempts != callevent.MaxAttempts || d.ResponseStatus == nil || *d.ResponseStatus != 503 {
			t.Fatalf("delivery %s while offline: %s after %d attempts, last %v", d.ID, d.Status, d.Attempts, d.ResponseStatus)
		}
	}

	st.StartAgent()
	var progress []agent.BackfillProgress
	res, err := st.Agent.Backfill(ctx, c, agent.BackfillOptions{
		Since: time.Hour, Forward: true,
		Header:   wire.Header{{Name: "Authorization", Value: "Bearer client-secret"}},
		Progress: func(p agent.BackfillProgress) { progress = append(progress, p) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Listed != 7 || res.Known != 2 || res.Missing != 5 || res.Fetched != 5 || res.Imported != 5 || res.Forwarded != 5 ||
		res.Delivered != 5 || res.Failed != 0 || len(res.Items) != 5 {
		t.Fatalf("backfill: %+v", res)
	}
	if last := progress[len(progress)-1]; last.Phase != "done" || last.Pages < 1 || last.Fetched != 5 || last.Imported != 5 || last.Forwarded != 5 {
		t.Errorf("last progress %+v", last)
	}

	// Every missed delivery is in the store once, marked as backfilled,
	// byte-exact and indexed like a capture from the tunnel.
	for _, d := range missed {
		rows := captures(t, ctx, st.AgentDB, agentdb.CaptureFilter{DeliveryID: d.ID})
		if len(rows) != 1 {
			t.Fatalf("delivery %s: %d captures, want 1", d.ID, len(rows))
		}
		got, err := st.AgentDB.Capture(ctx, rows[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := c.Delivery(ctx, d.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Source != agent.SourceBackfill || got.Method != "POST" || got.Path != "/hooks/voice" || got.Query != "src=svc" ||
			!bytes.Equal(got.Body, rec.Payload) || got.Event != d.Event || got.CallID != offline || got.Status != agentdb.StatusDelivered ||
			got.ResponseStatus != 200 || got.Target != h.URL+"/hooks/voice?src=svc" {
			t.Errorf("capture of %s: %+v", d.ID, got)
		}
	}
	// The handler got them oldest first, with the headers it checks.
	reqs := h.forCall(offline)
	var evs []string
	for _, r := range reqs {
		evs = append(evs, r.event)
		if r.header.Get("Authorization") != "Bearer client-secret" || r.header.Get("Content-Type") != "application/json" || r.uri != "/hooks/voice?src=svc" {
			t.Errorf("%s reached the handler as %s with %v", r.event, r.uri, r.header)
		}
	}
	if len(evs) != 5 || evs[0] != "call.started" || evs[1] != "call.connected" || evs[2] != "call.ended" {
		t.Errorf("the handler got %v", evs)
	}
	// The inspector lists them as backfilled.
	code, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/?source=backfill", "")
	var pg page
	json.Unmarshal(env.Data, &pg)
	if code != 200 || pg.Count != 5 {
		t.Errorf("inspector: %d, %d backfilled", code, pg.Count)
	}

	// Again: nothing new.
	again, err := st.Agent.Backfill(ctx, c, agent.BackfillOptions{Since: time.Hour, Forward: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.Imported != 0 || again.Missing != 0 || again.Known != 7 || again.Forwarded != 0 || len(again.Items) != 0 {
		t.Fatalf("second backfill: %+v", again)
	}
	if n := len(h.forCall(offline)); n != 5 {
		t.Fatalf("the handler got %d requests after the second run", n)
	}
	if n := len(captures(t, ctx, st.AgentDB, agentdb.CaptureFilter{})); n != 7 {
		t.Fatalf("%d captures after the second run, want 7", n)
	}

	// Without forwarding, and for one call: imports only.
	third := bfDispatch(t, base, map[string]any{"to_number": "+12025550143", "event_webhook_url": "http://127.0.0.1:1/nowhere", "scenario": "failed:no_answer"})
	settled(t, ctx, c, third, 2)
	only, err := st.Agent.Backfill(ctx, c, agent.BackfillOptions{CallID: third})
	if err != nil {
		t.Fatal(err)
	}
	if only.Listed != 2 || only.Imported != 2 || only.Forwarded != 0 || len(h.forCall(third)) != 0 {
		t.Fatalf("backfill of one call without forwarding: %+v", only)
	}
	for _, it := range only.Items {
		got, err := st.AgentDB.Capture(ctx, it.CaptureID)
		if err != nil || got.Path != "/nowhere" || got.Status != agentdb.StatusPending || got.Source != agent.SourceBackfill {
			t.Errorf("imported %s: %+v %v", it.DeliveryID, got, err)
		}
	}
}

// The whole chain: the emulator dispatches calls → relay → agent →
// handler. All six event kinds arrive, the delivery log shows them
// delivered, and a handler answering 500 makes the service retry on its
// schedule.
func TestEndToEndFromTheServiceToTheHandler(t *testing.T) {
	t.Parallel()
	const scale = 0.001
	ctx := bfCtx(t)
	h := newBFHandler(t)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	base, c := bfEmulator(t, scale)

	completed := bfDispatch(t, base, map[string]any{"to_number": "+12025550143", "event_webhook_url": st.TunnelURL + "/hooks"})
	busy := bfDispatch(t, base, map[string]any{"to_number": "+12025550143", "event_webhook_url": st.TunnelURL + "/hooks", "scenario": "failed:busy"})
	polltest.Until(t, 20*time.Second, func() bool {
		return len(h.forCall(completed)) >= 5 && len(h.forCall(busy)) >= 2
	}, "both calls' events at the handler")

	kinds := map[string]bool{}
	var got []string
	for _, r := range h.forCall(completed) {
		got = append(got, r.event)
		kinds[r.event] = true
	}
	if strings.Join(got, ",") != strings.Join(completedEvents, ",") {
		t.Errorf("completed call: the handler got %v", got)
	}
	got = nil
	for _, r := range h.forCall(busy) {
		got = append(got, r.event)
		kinds[r.event] = true
	}
	if strings.Join(got, ",") != "call.started,call.failed" {
		t.Errorf("busy call: the handler got %v", got)
	}
	if len(kinds) != 6 {
		t.Errorf("the handler saw %d event kinds, want all six: %v", len(kinds), kinds)
	}

	for callID, n := range map[string]int{completed: 5, busy: 2} {
		for _, d := range settled(t, ctx, c, callID, n) {
			if d.Status != "delivered" || d.Attempts != 1 || d.ResponseStatus == nil || *d.ResponseStatus != 200 || d.DeliveredAt.IsZero() {
				t.Errorf("delivery %s (%s): %s after %d attempts, %v", d.ID, d.Event, d.Status, d.Attempts, d.ResponseStatus)
			}
			rec, err := c.Delivery(ctx, d.ID)
			if err != nil {
				t.Fatal(err)
			}
			rows := captures(t, ctx, st.AgentDB, agentdb.CaptureFilter{DeliveryID: d.ID})
			if len(rows) != 1 || rows[0].Source != agent.SourceTunnel || rows[0].Event != d.Event {
				t.Fatalf("delivery %s: captures %+v", d.ID, rows)
			}
			full, _ := st.AgentDB.Capture(ctx, rows[0].ID)
			if !bytes.Equal(full.Body, rec.Payload) {
				t.Errorf("delivery %s: the agent captured other bytes than the service says it sent", d.ID)
			}
		}
	}

	// A handler answering 500: the service retries at 0, 30 s, 2 min,
	// 8 min and 32 min (scaled), then gives up; each attempt reaches the
	// handler through the tunnel.
	failing := bfDispatch(t, base, map[string]any{"to_number": "+12025550143", "event_webhook_url": st.TunnelURL + "/fail",
		"event_webhook_events": []string{"call.started"}})
	ds := settled(t, ctx, c, failing, 1)
	rec, err := c.Delivery(ctx, ds[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != "failed" || rec.Attempts != callevent.MaxAttempts || len(rec.AttemptLog) != callevent.MaxAttempts {
		t.Fatalf("after 500s: %s, %d attempts, log of %d", rec.Status, rec.Attempts, len(rec.AttemptLog))
	}
	log := append([]service.Attempt(nil), rec.AttemptLog...)
	sort.Slice(log, func(i, j int) bool { return log[i].N < log[j].N })
	for i, a := range log {
		if a.N != i+1 || a.ResponseStatus == nil || *a.ResponseStatus != 500 {
			t.Errorf("attempt %d: %+v", i+1, a)
		}
		if i == 0 {
			continue
		}
		// The delay before attempt i+1 is at least the documented one,
		// scaled; the documented delays grow, so the gaps do too.
		gap, want := a.At.Sub(log[i-1].At.Time), time.Duration(float64(callevent.RetrySchedule()[i])*scale)
		if gap < want {
			t.Errorf("attempt %d came %s after attempt %d; the schedule wants at least %s", i+1, gap, i, want)
		}
	}
	if n := len(h.forCall(failing)); n != callevent.MaxAttempts {
		t.Errorf("the handler got %d attempts, want %d", n, callevent.MaxAttempts)
	}
	// Recorded responses may wait a moment to share a commit; Flush
	// commits them.
	if err := st.Agent.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rows := captures(t, ctx, st.AgentDB, agentdb.CaptureFilter{DeliveryID: ds[0].ID})
	dups := 0
	for _, r := range rows {
		if r.ResponseStatus != 500 {
			t.Errorf("capture %s: handler status %d", r.ID, r.ResponseStatus)
		}
		if r.DuplicateOf != "" {
			dups++
		}
	}
	if len(rows) != callevent.MaxAttempts || dups != callevent.MaxAttempts-1 {
		t.Errorf("the agent holds %d captures of the failing delivery (%d marked duplicate)", len(rows), dups)
	}
}

func TestBackfillNeedsAHandlerToForward(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{})
	_, c := bfEmulator(t, 0.001)
	if _, err := st.Agent.Backfill(bfCtx(t), c, agent.BackfillOptions{Forward: true}); err == nil || !strings.Contains(err.Error(), "--forward-to") {
		t.Fatalf("forward without a handler: %v", err)
	}
}
