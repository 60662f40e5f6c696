package emulator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/inspector/voice/emulator"
	"github.com/calltap/calltap/inspector/voice/emulator/emulatortest"
	"github.com/calltap/calltap/relay/polltest"
)

// Keys every test server accepts.
const (
	rwKey   = emulatortest.Key     // webhooks:read, webhooks:write
	roKey   = emulatortest.ReadKey // webhooks:read
	bareKey = emulatortest.BareKey // no scope
)

// offsetClock is real time plus an offset a test can move forward.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// emu is a running emulator on a real loopback socket.
type emu struct {
	t     *testing.T
	srv   *emulator.Server
	url   string
	clock *offsetClock
	cfg   emulator.Config
}

// startEmu starts an emulator on a clock the test can move; edit adjusts
// the configuration first.
func startEmu(t *testing.T, edit func(*emulator.Config)) *emu {
	t.Helper()
	clock := &offsetClock{}
	e := emulatortest.Start(t, func(c *emulator.Config) {
		c.Clock = clock.Now
		if edit != nil {
			edit(c)
		}
	}, nil)
	return &emu{t: t, srv: e.Server, url: e.URL, clock: clock, cfg: e.Config}
}

// in returns e reporting to t (a subtest).
func (e *emu) in(t *testing.T) *emu {
	c := *e
	c.t = t
	return &c
}

// envelope is a decoded response.
type envelope struct {
	Status  bool            `json:"status"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
	Error   *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// do calls the API with key ("" for none) and returns the status and the
// envelope.
func (e *emu) do(method, path, key string, body any) (int, envelope) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		e.t.Fatalf("%s %s: %d, body is not the envelope: %v\n%s", method, path, resp.StatusCode, err, raw)
	}
	if env.Status != (resp.StatusCode < 400) || (env.Error == nil) != env.Status {
		e.t.Fatalf("%s %s: %d with an inconsistent envelope: %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, env
}

// ok calls the API expecting want and decodes data into out.
func (e *emu) ok(method, path, key string, body any, want int, out any) {
	e.t.Helper()
	code, env := e.do(method, path, key, body)
	if code != want {
		e.t.Fatalf("%s %s: status %d, want %d: %+v", method, path, code, want, env.Error)
	}
	if out != nil {
		if err := json.Unmarshal(env.Data, out); err != nil {
			e.t.Fatalf("%s %s: data: %v", method, path, err)
		}
	}
}

// fails calls the API expecting an error status and code.
func (e *emu) fails(method, path, key string, body any, want int, code string) string {
	e.t.Helper()
	got, env := e.do(method, path, key, body)
	if got != want || env.Error == nil || env.Error.Code != code {
		e.t.Fatalf("%s %s: status %d error %+v, want %d %s", method, path, got, env.Error, want, code)
	}
	return env.Error.Message
}

// dispatch starts a call and returns its id.
func (e *emu) dispatch(body map[string]any) string {
	e.t.Helper()
	var res emulator.DispatchResult
	e.ok("POST", "/api/v1/ext/calls/dispatch/", rwKey, body, http.StatusCreated, &res)
	if res.CallID == "" {
		e.t.Fatal("dispatch returned no call_id")
	}
	return res.CallID
}

// delivery reads one delivery record.
func (e *emu) delivery(id string) emulator.DeliveryRecord {
	e.t.Helper()
	var rec emulator.DeliveryRecord
	e.ok("GET", "/api/v1/ext/webhooks/"+id+"/", roKey, nil, http.StatusOK, &rec)
	return rec
}

// callDeliveries lists a call's deliveries (one page is plenty).
func (e *emu) callDeliveries(callID string) []emulator.DeliveryItem {
	e.t.Helper()
	var page struct {
		Count   int                     `json:"count"`
		Results []emulator.DeliveryItem `json:"results"`
	}
	e.ok("GET", "/api/v1/ext/webhooks/?call_id="+callID, roKey, nil, http.StatusOK, &page)
	return page.Results
}

// received is a request the target got.
type received struct {
	at     time.Time
	header http.Header
	body   []byte
	event  string
	id     string
	callID string
}

// target is a webhook handler on a real loopback socket that answers with
// what respond says (200 when nil) and records every request.
type target struct {
	*httptest.Server
	mu      sync.Mutex
	got     []received // guarded by mu
	respond func(n int, r *http.Request) int
}

func newTarget(t *testing.T, respond func(n int, r *http.Request) int) *target {
	tg := &target{respond: respond}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			ID    string `json:"id"`
			Event string `json:"event"`
			Call  struct {
				CallID string `json:"call_id"`
			} `json:"call"`
		}
		json.Unmarshal(body, &p)
		tg.mu.Lock()
		n := len(tg.got)
		tg.got = append(tg.got, received{at: time.Now(), header: r.Header.Clone(), body: body, event: p.Event, id: p.ID, callID: p.Call.CallID})
		tg.mu.Unlock()
		code := http.StatusOK
		if tg.respond != nil {
			code = tg.respond(n, r)
		}
		w.WriteHeader(code)
		io.WriteString(w, "answer "+http.StatusText(code))
	}))
	t.Cleanup(tg.Close)
	return tg
}

func (tg *target) requests() []received {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]received(nil), tg.got...)
}

func (tg *target) forCall(callID string) []received {
	var out []received
	for _, r := range tg.requests() {
		if r.callID == callID {
			out = append(out, r)
		}
	}
	return out
}

func TestParseKeys(t *testing.T) {
	keys, err := emulator.ParseKeys(strings.NewReader("# keys\n\ntest_key=webhooks: read, webhooks:write\nro_key=webhooks:read\nbare\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys[0].Key != "test_key" || len(keys[0].Scopes) != 2 || keys[0].Scopes[0] != emulator.ScopeWebhooksRead ||
		keys[1].Scopes[0] != emulator.ScopeWebhooksRead || keys[2].Key != "bare" || len(keys[2].Scopes) != 0 {
		t.Fatalf("keys = %+v", keys)
	}
	if _, err := emulator.ParseKeys(strings.NewReader("=webhooks:read\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("empty key: err = %v", err)
	}
}

func TestAuth(t *testing.T) {
	e := startEmu(t, nil)
	e.fails("GET", "/api/v1/ext/webhooks/", "", nil, 401, "unauthorized")
	e.fails("GET", "/api/v1/ext/webhooks/", "wrong_key", nil, 401, "unauthorized")
	e.fails("GET", "/api/v1/ext/contacts/", "test_ke", nil, 401, "unauthorized")
	e.fails("GET", "/api/v1/ext/no/such/endpoint", "", nil, 401, "unauthorized")
	e.fails("POST", "/api/v1/ext/calls/dispatch/", "", map[string]any{"to_number": "+12025550143"}, 401, "unauthorized")

	// Lowercase scheme is accepted; the key is what matters.
	req, _ := http.NewRequest("GET", e.url+"/api/v1/ext/webhooks/", nil)
	req.Header.Set("Authorization", "bearer "+roKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("lowercase bearer: %d", resp.StatusCode)
	}

	e.ok("GET", "/api/v1/ext/webhooks/", roKey, nil, 200, nil)
	e.fails("GET", "/api/v1/ext/webhooks/", bareKey, nil, 403, "forbidden")
	e.fails("GET", "/api/v1/ext/webhooks/"+"00000000-0000-0000-0000-000000000000/", bareKey, nil, 403, "forbidden")
	e.fails("POST", "/api/v1/ext/webhooks/replay/", roKey, map[string]any{"id": "00000000-0000-0000-0000-000000000000"}, 403, "forbidden")
	e.fails("POST", "/api/v1/ext/webhooks/replay/", rwKey, map[string]any{"id": "00000000-0000-0000-0000-000000000000"}, 404, "not_found")
	e.fails("GET", "/api/v1/ext/webhooks/00000000-0000-0000-0000-000000000000/", roKey, nil, 404, "not_found")
	e.fails("GET", "/api/v1/ext/webhooks/replay/", rwKey, nil, 405, "method_not_allowed")
	e.fails("DELETE", "/api/v1/ext/contacts/", bareKey, nil, 405, "method_not_allowed")
	e.fails("GET", "/api/v1/ext/no/such/endpoint", bareKey, nil, 404, "not_found")
	// Any valid key may read contacts and dispatch.
	e.ok("GET", "/api/v1/ext/contacts/", bareKey, nil, 200, nil)
	e.ok("POST", "/api/v1/ext/calls/dispatch/", bareKey, map[string]any{"to_number": "+12025550143"}, 201, nil)
}

func TestDispatchValidation(t *testing.T) {
	strict := startEmu(t, func(c *emulator.Config) { c.AllowHTTPWebhooks = false })
	loose := startEmu(t, nil)
	call := func(url string) map[string]any {
		return map[string]any{"to_number": "+12025550143", "event_webhook_url": url}
	}
	const path = "/api/v1/ext/calls/dispatch/"
	for _, e := range []*emu{strict, loose} {
		e.fails("POST", path, rwKey, call("ftp://127.0.0.1/hook"), 400, "invalid_request")
		e.fails("POST", path, rwKey, call("ws://127.0.0.1/hook"), 400, "invalid_request")
		e.fails("POST", path, rwKey, call("/relative/hook"), 400, "invalid_request")
		e.fails("POST", path, rwKey, call("http://hooks.example.com/hook"), 400, "invalid_request")
		e.fails("POST", path, rwKey, map[string]any{"to_number": "2025550143"}, 400, "invalid_request")
		e.fails("POST", path, rwKey, map[string]any{"to_number": "+12025550143", "scenario": "failed:bored"}, 400, "invalid_request")
		e.fails("POST", path, rwKey, map[string]any{"to_number": "+12025550143", "event_webhook_events": []string{"call.started", "call.exploded"}}, 400, "invalid_request")
		e.fails("POST", path, rwKey, map[string]any{"to_number": "+12025550143", "event_webhook_headers": map[string]any{"X-Secret": 42}}, 400, "invalid_request")
		e.fails("POST", path, rwKey, map[string]any{"to_number": "+12025550143", "event_webhook_headers": map[string]any{"X-Secret": "a\r\nX-Injected: 1"}}, 400, "invalid_request")
		e.fails("POST", path, rwKey, map[string]any{"to_number": "+12025550143", "event_webhook_headers": map[string]any{"Host": "evil"}}, 400, "invalid_request")
		e.fails("POST", path, rwKey, map[string]any{"to_number": "+12025550143", "timings": map[string]any{"talk_seconds": -1}}, 400, "invalid_request")
		e.ok("POST", path, rwKey, call("https://hooks.example.com/hook"), 201, nil)
	}
	msg := strict.fails("POST", path, rwKey, call("http://127.0.0.1:1/hook"), 400, "invalid_request")
	if !strings.Contains(msg, "https") {
		t.Errorf("message for http: %q", msg)
	}
	loose.ok("POST", path, rwKey, call("http://127.0.0.1:1/hook"), 201, nil)
	loose.ok("POST", path, rwKey, call("http://localhost:1/hook"), 201, nil)

	// Oversized and malformed bodies.
	big := map[string]any{"to_number": "+12025550143", "variables": map[string]any{"x": strings.Repeat("a", emulator.MaxDispatchBody)}}
	loose.fails("POST", path, rwKey, big, 413, "payload_too_large")
	req, _ := http.NewRequest("POST", loose.url+path, strings.NewReader("{not json"))
	req.Header.Set("Authorization", "Bearer "+rwKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("malformed body: %d", resp.StatusCode)
	}
}

// payloadOf decodes a delivered body.
type payloadOf struct {
	ID         string `json:"id"`
	Event      string `json:"event"`
	OccurredAt string `json:"occurred_at"`
	Call       struct {
		CallID          string         `json:"call_id"`
		Status          string         `json:"status"`
		OutcomeCode     *string        `json:"outcome_code"`
		DurationSeconds int            `json:"duration_seconds"`
		Variables       map[string]any `json:"variables"`
		Contact         struct {
			ID           string         `json:"id"`
			Name         string         `json:"name"`
			CustomFields map[string]any `json:"custom_fields"`
		} `json:"contact"`
	} `json:"call"`
	Data  json.RawMessage `json:"data"`
	Media *struct {
		RecordingURL  string `json:"recording_url"`
		TranscriptURL string `json:"transcript_url"`
		ExpiresIn     int    `json:"expires_in"`
	} `json:"media"`
	Analysis json.RawMessage `json:"analysis"`
}

func decodePayload(t *testing.T, b []byte) payloadOf {
	t.Helper()
	var p payloadOf
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("payload: %v\n%s", err, b)
	}
	return p
}

func TestCompletedCallDeliversEveryEventInOrder(t *testing.T) {
	e := startEmu(t, nil)
	tg := newTarget(t, nil)
	callID := e.dispatch(map[string]any{
		"to_number":             "+12025550143",
		"event_webhook_url":     tg.URL + "/hooks/voice?src=mock",
		"event_webhook_headers": map[string]any{"Authorization": "Bearer client-secret", "X-Env": "test"},
		"variables":             map[string]any{"lead_id": "L-42"},
		"contact":               map[string]any{"name": "Ada Lovelace", "custom_fields": map[string]any{"city": "London"}},
	})
	want := []string{"call.started", "call.connected", "call.ended", "call.recording_available", "call.analysis_completed"}
	polltest.Until(t, 10*time.Second, func() bool { return len(tg.forCall(callID)) >= len(want) }, "five events")
	got := tg.forCall(callID)
	if len(got) != len(want) {
		t.Fatalf("got %d requests, want %d", len(got), len(want))
	}
	ids := map[string]bool{}
	for i, r := range got {
		if r.event != want[i] {
			t.Fatalf("event %d is %s, want %s (order %v)", i, r.event, want[i], events(got))
		}
		if r.header.Get("Authorization") != "Bearer client-secret" || r.header.Get("X-Env") != "test" {
			t.Errorf("%s: configured headers missing: %v", r.event, r.header)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", r.event, ct)
		}
		if ids[r.id] || r.id == "" {
			t.Errorf("%s: delivery id %q not unique", r.event, r.id)
		}
		ids[r.id] = true
		p := decodePayload(t, r.body)
		if p.Call.Variables["lead_id"] != "L-42" || p.Call.Contact.Name != "Ada Lovelace" || p.Call.Contact.CustomFields["city"] != "London" {
			t.Errorf("%s: call block lost the dispatch's variables or contact: %+v", r.event, p.Call)
		}
		occurred, err := time.Parse(time.RFC3339Nano, p.OccurredAt)
		if err != nil {
			t.Errorf("%s: occurred_at %q: %v", r.event, p.OccurredAt, err)
		} else if occurred.After(e.clock.Now()) {
			t.Errorf("%s: occurred_at %s is in the future", r.event, p.OccurredAt)
		}
	}
	ended := decodePayload(t, got[2].body)
	if ended.Call.DurationSeconds != 94 {
		t.Errorf("duration_seconds = %d, want callevent's default 94 (time scale must not shrink it)", ended.Call.DurationSeconds)
	}

	// The delivery log has them all, delivered, with the exact bytes sent.
	polltest.Until(t, 5*time.Second, func() bool {
		items := e.callDeliveries(callID)
		for _, it := range items {
			if it.Status != emulator.StatusDelivered {
				return false
			}
		}
		return len(items) == len(want)
	}, "all delivered")
	for _, r := range got {
		rec := e.delivery(r.id)
		if !bytes.Equal(rec.Payload, r.body) {
			t.Errorf("%s: record payload differs from the bytes sent", r.event)
		}
		if rec.Attempts != 1 || rec.MaxAttempts != 5 || rec.ResponseStatus == nil || *rec.ResponseStatus != 200 ||
			rec.DeliveredAt.IsZero() || rec.Event != r.event || rec.CallID != callID || !strings.HasPrefix(rec.URL, tg.URL) ||
			rec.ResponseBody != "answer OK" || len(rec.AttemptLog) != 1 || rec.NextAttemptAt != nil {
			t.Errorf("%s: record %+v", r.event, rec.DeliveryItem)
		}
	}

	// The analysis links point at the emulator and work.
	analysis := decodePayload(t, got[4].body)
	if analysis.Media == nil || !strings.HasPrefix(analysis.Media.RecordingURL, e.url+"/media/") || analysis.Media.ExpiresIn != 3600 {
		t.Fatalf("media block: %+v", analysis.Media)
	}
	if len(analysis.Analysis) == 0 {
		t.Fatal("analysis block missing")
	}
	body, ct := fetch(t, analysis.Media.RecordingURL, 200)
	if !bytes.HasPrefix(body, []byte("RIFF")) || !bytes.Equal(body[8:12], []byte("WAVE")) || ct != "audio/wav" {
		t.Errorf("recording: %s, %q", ct, body[:min(len(body), 12)])
	}
	body, _ = fetch(t, analysis.Media.TranscriptURL, 200)
	if !strings.Contains(string(body), "Ada Lovelace:") {
		t.Errorf("transcript: %s", body)
	}
}

func events(rs []received) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.event)
	}
	return out
}

// fetch GETs a URL without a key and returns the body and Content-Type.
func fetch(t *testing.T, url string, want int) ([]byte, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %d, want %d: %s", url, resp.StatusCode, want, b)
	}
	return b, resp.Header.Get("Content-Type")
}

func TestFailedCallEndsWithCallFailed(t *testing.T) {
	e := startEmu(t, nil)
	tg := newTarget(t, nil)
	for _, sc := range []struct{ scenario, code string }{
		{emulator.ScenarioBusy, "busy"}, {emulator.ScenarioNoAnswer, "no_answer"}, {emulator.ScenarioDispatchError, "dispatch_error"},
	} {
		callID := e.dispatch(map[string]any{"to_number": "+12025550143", "event_webhook_url": tg.URL, "scenario": sc.scenario})
		polltest.Until(t, 10*time.Second, func() bool { return len(tg.forCall(callID)) >= 2 }, sc.scenario+" events")
		got := tg.forCall(callID)
		if ev := events(got); len(ev) != 2 || ev[0] != "call.started" || ev[1] != "call.failed" {
			t.Fatalf("%s: events %v", sc.scenario, ev)
		}
		p := decodePayload(t, got[1].body)
		if p.Call.OutcomeCode == nil || *p.Call.OutcomeCode != sc.code {
			t.Errorf("%s: outcome_code %v, want %s", sc.scenario, p.Call.OutcomeCode, sc.code)
		}
		// All of a call's deliveries exist once its last is due: the log
		// holds exactly two, and never call.ended.
		if items := e.callDeliveries(callID); len(items) != 2 {
			t.Errorf("%s: %d deliveries in the log", sc.scenario, len(items))
		}
		// No recording for a call that never connected.
		e.fails("GET", "/api/v1/ext/call_logs/"+callID+"/media/", bareKey, nil, 404, "not_found")
	}
}

func TestSubscription(t *testing.T) {
	e := startEmu(t, nil)
	tg := newTarget(t, nil)
	var res emulator.DispatchResult
	e.ok("POST", "/api/v1/ext/calls/dispatch/", rwKey, map[string]any{
		"to_number": "+12025550143", "event_webhook_url": tg.URL,
		"event_webhook_events": []string{"call.analysis_completed", "call.ended"},
	}, 201, &res)
	if strings.Join(res.Events, ",") != "call.ended,call.analysis_completed" {
		t.Fatalf("dispatch says it will send %v", res.Events)
	}
	polltest.Until(t, 10*time.Second, func() bool { return len(tg.forCall(res.CallID)) >= 2 }, "two events")
	// The recording is due between the two; once analysis has been sent,
	// nothing else can come.
	if ev := events(tg.forCall(res.CallID)); strings.Join(ev, ",") != "call.ended,call.analysis_completed" {
		t.Fatalf("events %v", ev)
	}
	if n := len(e.callDeliveries(res.CallID)); n != 2 {
		t.Fatalf("%d deliveries in the log", n)
	}
}

// startedOnly dispatches a call that sends only call.started to url.
func (e *emu) startedOnly(url string) (callID, deliveryID string) {
	e.t.Helper()
	callID = e.dispatch(map[string]any{"to_number": "+12025550143", "event_webhook_url": url, "event_webhook_events": []string{"call.started"}})
	polltest.Until(e.t, 5*time.Second, func() bool { return len(e.callDeliveries(callID)) == 1 }, "the delivery")
	return callID, e.callDeliveries(callID)[0].ID
}

// waitSettled waits until a delivery is no longer pending.
func (e *emu) waitSettled(id string) emulator.DeliveryRecord {
	e.t.Helper()
	var rec emulator.DeliveryRecord
	polltest.Until(e.t, 20*time.Second, func() bool {
		rec = e.delivery(id)
		return rec.Status != emulator.StatusPending
	}, "delivery "+id+" to settle")
	return rec
}

func TestRetriesFollowTheScaledSchedule(t *testing.T) {
	const scale = 0.0005
	e := startEmu(t, func(c *emulator.Config) { c.TimeScale = scale })
	tg := newTarget(t, func(int, *http.Request) int { return 500 })
	_, id := e.startedOnly(tg.URL)
	rec := e.waitSettled(id)
	if rec.Status != emulator.StatusFailed || rec.Attempts != 5 || len(rec.AttemptLog) != 5 || rec.NextAttemptAt != nil {
		t.Fatalf("after 500s: status %s attempts %d log %d", rec.Status, rec.Attempts, len(rec.AttemptLog))
	}
	if rec.ResponseStatus == nil || *rec.ResponseStatus != 500 || rec.Error != "HTTP 500" || rec.ResponseBody != "answer Internal Server Error" {
		t.Errorf("last attempt not recorded on the delivery: %+v %q", rec.DeliveryItem, rec.ResponseBody)
	}
	got := tg.requests()
	if len(got) != 5 {
		t.Fatalf("target got %d requests, want 5", len(got))
	}
	for i, r := range got {
		if !bytes.Equal(r.body, got[0].body) || r.id != id {
			t.Errorf("attempt %d sent other bytes or another id", i+1)
		}
	}
	// Each attempt waited at least the documented delay, scaled.
	for i := 1; i < len(rec.AttemptLog); i++ {
		a, b := rec.AttemptLog[i-1], rec.AttemptLog[i]
		if a.N != i || b.Attempt != i+1 || b.Replay != 0 || b.ResponseStatus == nil || *b.ResponseStatus != 500 {
			t.Errorf("attempt log entry %d: %+v", i, b)
		}
		ta, _ := time.Parse(time.RFC3339Nano, *a.At)
		tb, _ := time.Parse(time.RFC3339Nano, *b.At)
		if gap, min := tb.Sub(ta), time.Duration(float64(callevent.RetrySchedule()[i])*scale); gap < min {
			t.Errorf("attempt %d came %s after attempt %d; the schedule wants at least %s", i+1, gap, i, min)
		}
	}
}

func TestRetryRules(t *testing.T) {
	e := startEmu(t, func(c *emulator.Config) { c.TimeScale = 0.0002; c.DeliveryTimeout = 300 * time.Millisecond })
	cases := []struct {
		name     string
		answers  []int // the target's answers in turn; -1 hangs until the emulator gives up
		status   string
		attempts int
		errText  string
	}{
		{"404 is not retried", []int{404}, emulator.StatusFailed, 1, "HTTP 404: not retried"},
		{"401 is not retried", []int{401}, emulator.StatusFailed, 1, "HTTP 401: not retried"},
		{"3xx is not followed nor retried", []int{302}, emulator.StatusFailed, 1, "HTTP 302: not retried"},
		{"408 is retried", []int{408, 200}, emulator.StatusDelivered, 2, ""},
		{"429 is retried", []int{429, 429, 204}, emulator.StatusDelivered, 3, ""},
		{"503 is retried", []int{503, 200}, emulator.StatusDelivered, 2, ""},
		{"a time-out is retried", []int{-1, 200}, emulator.StatusDelivered, 2, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tg := newTarget(t, func(n int, r *http.Request) int {
				code := c.answers[min(n, len(c.answers)-1)]
				if code == -1 {
					<-r.Context().Done()
					return 200
				}
				return code
			})
			e := e.in(t)
			_, id := e.startedOnly(tg.URL)
			rec := e.waitSettled(id)
			if rec.Status != c.status || rec.Attempts != c.attempts || len(rec.AttemptLog) != c.attempts || rec.Error != c.errText {
				t.Fatalf("status %s attempts %d (log %d) error %q; want %s %d %q", rec.Status, rec.Attempts, len(rec.AttemptLog), rec.Error, c.status, c.attempts, c.errText)
			}
			if n := len(tg.requests()); n != c.attempts {
				t.Fatalf("target got %d requests", n)
			}
			if c.answers[0] == -1 && !strings.Contains(rec.AttemptLog[0].Error, "timed out") {
				t.Errorf("time-out recorded as %q", rec.AttemptLog[0].Error)
			}
		})
	}
	t.Run("a network error is retried to the end", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		e := e.in(t)
		dead := "http://" + ln.Addr().String() + "/hook"
		ln.Close()
		_, id := e.startedOnly(dead)
		rec := e.waitSettled(id)
		if rec.Status != emulator.StatusFailed || rec.Attempts != 5 || rec.ResponseStatus != nil || rec.Error == "" {
			t.Fatalf("status %s attempts %d response %v error %q", rec.Status, rec.Attempts, rec.ResponseStatus, rec.Error)
		}
	})
}

func TestReplayGivesAFreshBudget(t *testing.T) {
	e := startEmu(t, func(c *emulator.Config) { c.TimeScale = 0.0002 })
	var healthy atomic.Bool
	tg := newTarget(t, func(int, *http.Request) int {
		if healthy.Load() {
			return 200
		}
		return 503
	})
	_, id := e.startedOnly(tg.URL)
	if rec := e.waitSettled(id); rec.Status != emulator.StatusFailed || rec.Attempts != 5 {
		t.Fatalf("first budget: %s after %d", rec.Status, rec.Attempts)
	}

	var res emulator.ReplayResult
	e.ok("POST", "/api/v1/ext/webhooks/replay/", rwKey, map[string]any{"id": id}, 200, &res)
	if res.ID != id || res.Status != emulator.StatusPending || !res.Queued {
		t.Fatalf("replay result %+v", res)
	}
	rec := e.waitSettled(id)
	if rec.Status != emulator.StatusFailed || rec.Attempts != 5 || len(rec.AttemptLog) != 10 {
		t.Fatalf("second budget: %s after %d (log %d)", rec.Status, rec.Attempts, len(rec.AttemptLog))
	}
	if last := rec.AttemptLog[9]; last.N != 10 || last.Replay != 1 || last.Attempt != 5 {
		t.Errorf("last attempt of the replay: %+v", last)
	}

	healthy.Store(true) // the client fixed its endpoint
	e.ok("POST", "/api/v1/ext/webhooks/replay/", rwKey, map[string]any{"id": id}, 200, &res)
	rec = e.waitSettled(id)
	if rec.Status != emulator.StatusDelivered || rec.Attempts != 1 || len(rec.AttemptLog) != 11 || rec.DeliveredAt.IsZero() || rec.Error != "" {
		t.Fatalf("after the fix: %s after %d (log %d) error %q", rec.Status, rec.Attempts, len(rec.AttemptLog), rec.Error)
	}
	got := tg.requests()
	if len(got) != 11 {
		t.Fatalf("target got %d requests", len(got))
	}
	for _, r := range got {
		if !bytes.Equal(r.body, got[0].body) {
			t.Fatal("a replay changed the payload")
		}
	}
	if !bytes.Equal(rec.Payload, got[0].body) {
		t.Fatal("record payload differs from what was sent")
	}

	e.fails("POST", "/api/v1/ext/webhooks/replay/", rwKey, map[string]any{}, 400, "invalid_request")
	e.fails("POST", "/api/v1/ext/webhooks/replay/", rwKey, map[string]any{"id": "8a1f6a9e-0000-4000-8000-000000000000"}, 404, "not_found")
}

type page[T any] struct {
	Count   int `json:"count"`
	Limit   int `json:"limit"`
	Offset  int `json:"offset"`
	Results []T `json:"results"`
}

func TestPaging(t *testing.T) {
	const n = 230
	e := startEmu(t, func(c *emulator.Config) { c.Seed = n })

	var contacts page[emulator.ContactItem]
	e.ok("GET", "/api/v1/ext/contacts/", bareKey, nil, 200, &contacts)
	if contacts.Count != n || contacts.Limit != 50 || contacts.Offset != 0 || len(contacts.Results) != 50 {
		t.Fatalf("default page: count %d limit %d offset %d results %d", contacts.Count, contacts.Limit, contacts.Offset, len(contacts.Results))
	}
	e.ok("GET", "/api/v1/ext/contacts/?limit=500", bareKey, nil, 200, &contacts)
	if contacts.Count != n || contacts.Limit != 200 || len(contacts.Results) != 200 {
		t.Fatalf("limit=500: count %d limit %d results %d", contacts.Count, contacts.Limit, len(contacts.Results))
	}
	e.fails("GET", "/api/v1/ext/contacts/?limit=-1", bareKey, nil, 400, "invalid_request")
	e.fails("GET", "/api/v1/ext/webhooks/?offset=x", roKey, nil, 400, "invalid_request")

	// Walk as section 4.7 says: the limit received sets the next offset.
	walk := func(path, key string) (ids map[string]bool, count int) {
		ids = map[string]bool{}
		for offset := 0; ; {
			var p page[struct {
				ID string `json:"id"`
			}]
			e.ok("GET", path+"&offset="+itoa(offset), key, nil, 200, &p)
			count = p.Count
			for _, r := range p.Results {
				if ids[r.ID] {
					t.Fatalf("%s: %s seen twice with nothing inserted", path, r.ID)
				}
				ids[r.ID] = true
			}
			offset += p.Limit
			if offset >= p.Count {
				return ids, count
			}
		}
	}
	if ids, count := walk("/api/v1/ext/contacts/?limit=500", bareKey); len(ids) != n || count != n {
		t.Fatalf("contacts walk: %d ids of %d", len(ids), count)
	}
	ids, count := walk("/api/v1/ext/webhooks/?limit=1000", roKey)
	if count <= 200 || len(ids) != count {
		t.Fatalf("delivery walk: %d ids of %d", len(ids), count)
	}

	// Seeded deliveries read like real ones.
	var deliveries page[emulator.DeliveryItem]
	e.ok("GET", "/api/v1/ext/webhooks/?status=failed&limit=1", roKey, nil, 200, &deliveries)
	if deliveries.Count == 0 || deliveries.Results[0].Status != emulator.StatusFailed {
		t.Fatalf("no failed seeded delivery: %+v", deliveries)
	}
	rec := e.delivery(deliveries.Results[0].ID)
	if len(rec.AttemptLog) != 1 || rec.Error != "HTTP 404: not retried" || !json.Valid(rec.Payload) {
		t.Errorf("seeded failed delivery: %+v", rec)
	}
	// Newest first.
	e.ok("GET", "/api/v1/ext/webhooks/?limit=200", roKey, nil, 200, &deliveries)
	for i := 1; i < len(deliveries.Results); i++ {
		if deliveries.Results[i].CreatedAt.After(deliveries.Results[i-1].CreatedAt.Time) {
			t.Fatalf("deliveries not newest first at %d", i)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestContactSearch(t *testing.T) {
	e := startEmu(t, func(c *emulator.Config) { c.Seed = 120 })
	var all page[emulator.ContactItem]
	e.ok("GET", "/api/v1/ext/contacts/?limit=200", bareKey, nil, 200, &all)
	austin := 0
	for _, c := range all.Results {
		var cf map[string]any
		json.Unmarshal(c.CustomFields, &cf)
		if cf["city"] == "Austin" {
			austin++
		}
	}
	if austin == 0 {
		t.Fatal("no seeded contact in Austin")
	}
	var res page[emulator.ContactItem]
	e.ok("GET", "/api/v1/ext/contacts/search/?city=austin&limit=10", bareKey, nil, 200, &res)
	if res.Count != austin || res.Limit != 10 || len(res.Results) != min(austin, 10) {
		t.Fatalf("city=austin: count %d (want %d) limit %d results %d", res.Count, austin, res.Limit, len(res.Results))
	}
	for _, c := range res.Results {
		if !strings.Contains(string(c.CustomFields), `"city":"Austin"`) {
			t.Errorf("%s is not in Austin: %s", c.ID, c.CustomFields)
		}
	}
	// A contact field is matched before a custom field of the same name.
	one := all.Results[7]
	e.ok("GET", "/api/v1/ext/contacts/search/?phone="+strings.ReplaceAll(one.Phone, "+", "%2B"), bareKey, nil, 200, &res)
	if res.Count != 1 || res.Results[0].ID != one.ID {
		t.Fatalf("phone search: %+v", res)
	}
	e.ok("GET", "/api/v1/ext/contacts/search/?city=Austin&city=Denver&plan=pro", bareKey, nil, 200, &res)
	for _, c := range res.Results {
		s := string(c.CustomFields)
		if !(strings.Contains(s, `"Austin"`) || strings.Contains(s, `"Denver"`)) || !strings.Contains(s, `"plan":"pro"`) {
			t.Errorf("%s does not match: %s", c.ID, s)
		}
	}
	// A field that is neither a contact field nor a custom field in use.
	e.fails("GET", "/api/v1/ext/contacts/search/?favourite_colour=teal", bareKey, nil, 400, "invalid_request")
	// Until a contact uses it.
	e.dispatch(map[string]any{"to_number": "+12025550199", "contact": map[string]any{"name": "Grace Hopper", "custom_fields": map[string]any{"favourite_colour": "teal"}}})
	e.ok("GET", "/api/v1/ext/contacts/search/?favourite_colour=TEAL", bareKey, nil, 200, &res)
	if res.Count != 1 || res.Results[0].Name != "Grace Hopper" || res.Results[0].Phone != "+12025550199" {
		t.Fatalf("custom field in use: %+v", res)
	}
	// A dispatch naming a stored contact uses it, adding what it gives.
	tg := newTarget(t, nil)
	callID := e.dispatch(map[string]any{"to_number": one.Phone, "event_webhook_url": tg.URL, "event_webhook_events": []string{"call.started"},
		"contact": map[string]any{"id": one.ID, "custom_fields": map[string]any{"tier": "gold"}}})
	polltest.Until(t, 5*time.Second, func() bool { return len(tg.forCall(callID)) == 1 }, "call.started")
	p := decodePayload(t, tg.forCall(callID)[0].body)
	if p.Call.Contact.ID != one.ID || p.Call.Contact.Name != one.Name || p.Call.Contact.CustomFields["tier"] != "gold" || p.Call.Contact.CustomFields["city"] == nil {
		t.Fatalf("payload contact %+v, stored %+v", p.Call.Contact, one)
	}
	e.ok("GET", "/api/v1/ext/contacts/search/?tier=gold", bareKey, nil, 200, &res)
	if res.Count != 1 || res.Results[0].ID != one.ID || res.Results[0].Name != one.Name {
		t.Fatalf("tier=gold: %+v", res)
	}

	// /contacts/ itself takes no filters.
	e.ok("GET", "/api/v1/ext/contacts/?city=Austin", bareKey, nil, 200, &res)
	if res.Count != 121 {
		t.Fatalf("/contacts/ count %d", res.Count)
	}
}

func TestMediaLinksExpire(t *testing.T) {
	e := startEmu(t, func(c *emulator.Config) { c.MediaExpiresIn = 10 * time.Minute })
	callID := e.dispatch(map[string]any{"to_number": "+12025550143", "contact": map[string]any{"name": "Alan Turing"}})
	var links emulator.MediaLinks
	polltest.Until(t, 10*time.Second, func() bool {
		code, env := e.do("GET", "/api/v1/ext/call_logs/"+callID+"/media/", bareKey, nil)
		if code == 200 {
			json.Unmarshal(env.Data, &links)
			return true
		}
		if code != 404 {
			t.Fatalf("media: %d %+v", code, env.Error)
		}
		return false
	}, "the recording")
	if links.CallID != callID || links.ExpiresIn != 600 || links.ExpiresAt == nil {
		t.Fatalf("links %+v", links)
	}
	wav, _ := fetch(t, links.RecordingURL, 200)
	if len(wav) < 1000 || string(wav[:4]) != "RIFF" {
		t.Fatalf("recording of %d bytes", len(wav))
	}
	text, ct := fetch(t, links.TranscriptURL, 200)
	if !strings.HasPrefix(ct, "text/plain") || !strings.Contains(string(text), "Alan Turing:") {
		t.Fatalf("transcript %q: %s", ct, text)
	}
	// A forged or altered link is refused.
	fetch(t, strings.Replace(links.RecordingURL, "signature=", "signature=00", 1), 403)
	fetch(t, strings.Replace(links.RecordingURL, "recording.wav", "transcript.txt", 1), 403)

	e.clock.Advance(10*time.Minute + time.Second)
	fetch(t, links.RecordingURL, 403)
	fetch(t, links.TranscriptURL, 403)
	// A fresh link works again.
	e.ok("GET", "/api/v1/ext/call_logs/"+callID+"/media/", bareKey, nil, 200, &links)
	fetch(t, links.RecordingURL, 200)
	e.fails("GET", "/api/v1/ext/call_logs/8a1f6a9e-0000-4000-8000-000000000000/media/", bareKey, nil, 404, "not_found")
}

// Deliveries live in the database: a call dispatched by one run is
// delivered by the next.
func TestDeliveriesSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	tg := newTarget(t, nil)
	cfg := emulator.Config{Keys: []emulator.Key{{Key: rwKey, Scopes: []string{emulator.ScopeWebhooksRead}}}, DataDir: dir, TimeScale: 0.001, AllowHTTPWebhooks: true}
	first, err := emulator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Dispatch without a running scheduler, as if the process stopped at once.
	rec := httptest.NewRecorder()
	body, _ := json.Marshal(map[string]any{"to_number": "+12025550143", "event_webhook_url": tg.URL, "scenario": emulator.ScenarioBusy})
	req := httptest.NewRequest("POST", "/api/v1/ext/calls/dispatch/", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+rwKey)
	first.Handler().ServeHTTP(rec, req)
	if rec.Code != 201 {
		t.Fatalf("dispatch: %d %s", rec.Code, rec.Body)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second, err := emulator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- second.Run(ctx) }()
	polltest.Until(t, 10*time.Second, func() bool { return len(tg.requests()) >= 2 }, "the events after the restart")
	cancel()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	second.Close()
	if ev := events(tg.requests()); strings.Join(ev, ",") != "call.started,call.failed" {
		t.Fatalf("events %v", ev)
	}
}
