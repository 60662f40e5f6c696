package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
)

type page struct {
	Count   int `json:"count"`
	Limit   int `json:"limit"`
	Offset  int `json:"offset"`
	Results []struct {
		ID       string `json:"id"`
		Event    string `json:"event"`
		CallID   string `json:"call_id"`
		ReplayOf string `json:"replay_of"`
		Path     string `json:"path"`
	} `json:"results"`
}

func event(kind, callID string, i int) string {
	return fmt.Sprintf(`{"id":"00000000-0000-4000-8000-%012d","event":%q,"occurred_at":"2026-11-22T10:00:00Z","call":{"call_id":%q}}`, i, kind, callID)
}

type handler struct {
	mu     sync.Mutex
	bodies []string
	paths  []string
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.bodies = append(h.bodies, string(b))
	h.paths = append(h.paths, r.URL.RequestURI())
	h.mu.Unlock()
	w.WriteHeader(200)
}

func (h *handler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.bodies)
}

func (h *handler) last() (string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bodies[len(h.bodies)-1], h.paths[len(h.paths)-1]
}

func send(t *testing.T, url, body string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d", url, resp.StatusCode)
	}
}

func TestPagingRules(t *testing.T) {
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL, Relay: func(c *relay.Config) { c.RateBurst = 1000 }})
	const n = 230
	for i := 0; i < n; i++ {
		kind := "call.started"
		if i%2 == 1 {
			kind = "call.ended"
		}
		send(t, st.TunnelURL+"/hook", event(kind, fmt.Sprintf("call-%d", i%10), i))
	}
	api := st.InspectorURL + "/api/v1/ext/webhooks/"

	code, env := inspectortest.Do(t, "GET", api+"?limit=500", "")
	var p page
	json.Unmarshal(env.Data, &p)
	if code != 200 || p.Limit != 200 || len(p.Results) != 200 || p.Count != n {
		t.Fatalf("limit=500: code %d limit %d results %d count %d", code, p.Limit, len(p.Results), p.Count)
	}
	_, env = inspectortest.Do(t, "GET", api, "")
	json.Unmarshal(env.Data, &p)
	if p.Limit != 50 || len(p.Results) != 50 {
		t.Errorf("default page: limit %d, %d results", p.Limit, len(p.Results))
	}
	// Walk as section 4.7 says: offset grows by the limit received until it reaches count.
	seen := map[string]bool{}
	for offset := 0; ; {
		_, env := inspectortest.Do(t, "GET", fmt.Sprintf("%s?limit=70&offset=%d", api, offset), "")
		var p page
		json.Unmarshal(env.Data, &p)
		if p.Offset != offset || p.Count != n {
			t.Fatalf("offset %d: got offset %d count %d", offset, p.Offset, p.Count)
		}
		for _, r := range p.Results {
			if seen[r.ID] {
				t.Fatalf("id %s twice", r.ID)
			}
			seen[r.ID] = true
		}
		offset += p.Limit
		if offset >= p.Count {
			break
		}
	}
	if len(seen) != n {
		t.Errorf("walk saw %d of %d", len(seen), n)
	}
	for _, bad := range []string{"limit=-1", "limit=abc", "offset=-5", "offset=1.5"} {
		code, env := inspectortest.Do(t, "GET", api+"?"+bad, "")
		if code != 400 || env.Error.Code != "invalid_request" {
			t.Errorf("%s: %d %+v", bad, code, env.Error)
		}
	}
	// Filters narrow, and count follows the filter.
	_, env = inspectortest.Do(t, "GET", api+"?event=call.ended&call_id=call-3", "")
	json.Unmarshal(env.Data, &p)
	if p.Count != 23 {
		t.Errorf("event+call_id filter: count %d, want 23", p.Count)
	}
	for _, r := range p.Results {
		if r.Event != "call.ended" || r.CallID != "call-3" {
			t.Errorf("filter let through %+v", r)
		}
	}
}

func TestDetailReplayAndHistory(t *testing.T) {
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	other := &handler{}
	os := httptest.NewServer(other)
	defer os.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL + "/hooks"})
	send(t, st.TunnelURL+"/voice?x=1", event("call.ended", "c-1", 1))

	_, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/", "")
	var p page
	json.Unmarshal(env.Data, &p)
	id := p.Results[0].ID

	code, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/"+id+"/", "")
	var d struct {
		ID             string          `json:"id"`
		Event          string          `json:"event"`
		CallID         string          `json:"call_id"`
		Status         string          `json:"status"`
		ResponseStatus int             `json:"response_status"`
		Payload        json.RawMessage `json:"payload"`
		Body           string          `json:"body"`
		Method         string          `json:"method"`
		Query          string          `json:"query"`
		RequestHeaders [][2]string     `json:"request_headers"`
		URL            string          `json:"url"`
	}
	json.Unmarshal(env.Data, &d)
	if code != 200 || d.Event != "call.ended" || d.CallID != "c-1" || d.Status != "delivered" || d.ResponseStatus != 200 ||
		d.Method != "POST" || d.Query != "x=1" || !strings.Contains(string(d.Payload), `"call.ended"`) || d.URL != hs.URL+"/hooks/voice?x=1" {
		t.Fatalf("detail: %d %+v", code, d)
	}

	if code, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/nope/", ""); code != 404 || env.Error.Code != "not_found" {
		t.Errorf("unknown id: %d", code)
	}
	replay := st.InspectorURL + "/api/v1/ext/webhooks/replay/"
	if code, env := inspectortest.Do(t, "POST", replay, `{"id":"nope"}`); code != 404 || env.Error.Code != "not_found" {
		t.Errorf("replay unknown id: %d", code)
	}
	if code, env := inspectortest.Do(t, "POST", replay, `not json`); code != 400 || env.Error.Code != "invalid_request" {
		t.Errorf("replay bad body: %d", code)
	}

	code, env = inspectortest.Do(t, "POST", replay, fmt.Sprintf(`{"id":%q}`, id))
	var rr struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Queued bool   `json:"queued"`
	}
	json.Unmarshal(env.Data, &rr)
	if code != 200 || rr.ID == "" || rr.ID == id || rr.Status != "delivered" || rr.Queued {
		t.Fatalf("replay: %d %+v", code, rr)
	}
	if body, path := h.last(); h.count() != 2 || body != event("call.ended", "c-1", 1) || path != "/hooks/voice?x=1" {
		t.Errorf("replay reached the handler as %s %s", path, body)
	}
	code, env = inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/"+rr.ID+"/", "")
	var rd struct {
		ReplayOf    string `json:"replay_of"`
		Source      string `json:"source"`
		DuplicateOf string `json:"duplicate_of"`
	}
	json.Unmarshal(env.Data, &rd)
	if code != 200 || rd.ReplayOf != id || rd.Source != "replay" {
		t.Errorf("stored replay: %+v", rd)
	}

	// Edited, to another URL.
	code, _ = inspectortest.Do(t, "POST", replay, fmt.Sprintf(`{"id":%q,"to":%q,"body":"{\"edited\":true}","method":"PUT"}`, id, os.URL+"/elsewhere"))
	if body, path := other.last(); code != 200 || body != `{"edited":true}` || path != "/elsewhere" {
		t.Errorf("edited replay to another URL: %d %s %s", code, path, body)
	}

	// History survives an agent restart.
	st.StopAgent()
	st.StartAgent()
	_, env = inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/", "")
	json.Unmarshal(env.Data, &p)
	if p.Count != 3 {
		t.Errorf("after restart: count %d, want 3", p.Count)
	}
}

// A live request whose capture cannot be saved is refused (503 with
// Retry-After), so that its sender sends it again, though the handler,
// reached while the commit ran, may have answered it: an answer to the
// sender means a saved capture.
func TestLiveRequestNotSavedIsRefused(t *testing.T) {
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL})
	send(t, st.TunnelURL+"/hook", event("call.started", "call-1", 1))
	st.AgentDB.Close() // every write fails from now on
	resp, err := http.Post(st.TunnelURL+"/hook", "application/json", strings.NewReader(event("call.ended", "call-1", 2)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "could not save") {
		t.Fatalf("a request the agent could not save: %d %s", resp.StatusCode, body)
	}
}

// The inspector exports what its filters select, as JSON Lines or HAR, and
// replays a whole call in the background.
func TestExportAndReplayCallThroughTheAPI(t *testing.T) {
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL + "/hooks"})
	send(t, st.TunnelURL+"/voice", event("call.started", "c-9", 1))
	send(t, st.TunnelURL+"/voice", event("call.ended", "c-9", 2))
	send(t, st.TunnelURL+"/voice", event("call.started", "c-10", 3))

	get := func(url string) (int, string, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Disposition"), string(b)
	}
	code, disp, body := get(st.InspectorURL + "/api/v1/ext/export?call_id=c-9")
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if code != 200 || !strings.Contains(disp, ".jsonl") || len(lines) != 3 || !strings.Contains(lines[0], `"calltap-export"`) || !strings.Contains(lines[2], "call.ended") {
		t.Errorf("export: %d %q\n%s", code, disp, body)
	}
	code, disp, body = get(st.InspectorURL + "/api/v1/ext/export?call_id=c-9&format=har")
	var doc struct {
		Log struct {
			Version string            `json:"version"`
			Entries []json.RawMessage `json:"entries"`
		} `json:"log"`
	}
	if code != 200 || !strings.Contains(disp, ".har") || json.Unmarshal([]byte(body), &doc) != nil || doc.Log.Version != "1.2" || len(doc.Log.Entries) != 2 {
		t.Errorf("HAR export: %d %q\n%s", code, disp, body)
	}
	if code, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/export?format=zip", ""); code != 400 || env.Error == nil {
		t.Errorf("a bad format: %d", code)
	}
	if code, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/export?call_id=nope", ""); code != 404 || env.Error == nil {
		t.Errorf("an empty selection: %d", code)
	}

	before := h.count()
	code, env := inspectortest.Do(t, "POST", st.InspectorURL+"/api/v1/ext/calls/c-9/replay/", `{"time_scale":0}`, "Content-Type", "application/json")
	var res struct {
		Count int `json:"count"`
	}
	json.Unmarshal(env.Data, &res)
	if code != 202 || res.Count != 2 {
		t.Fatalf("replay the call: %d %s", code, env.Data)
	}
	polltest.Until(t, 10*time.Second, func() bool { return h.count() == before+2 }, "the call's two events were not replayed")
	if code, env := inspectortest.Do(t, "POST", st.InspectorURL+"/api/v1/ext/calls/nope/replay/", `{}`, "Content-Type", "application/json"); code != 404 || env.Error == nil {
		t.Errorf("replay of an unknown call: %d", code)
	}
}
