package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// seen is a local handler that keeps each request it got as one line.
type seen struct {
	mu   sync.Mutex
	reqs []string // guarded by mu: "METHOD uri header-x body"
}

func (s *seen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, fmt.Sprintf("%s %s %s %s", r.Method, r.URL.RequestURI(), r.Header.Get("X-Secret"), b))
	s.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

func (s *seen) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...)
}

// runAgent starts an agent over a real store forwarding to h, and stops it
// when the test ends.
func runAgent(t *testing.T, h http.Handler) *Agent {
	t.Helper()
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	d := openDisk(t)
	a, err := New(Config{Store: d.store, ForwardTo: hs.URL + "/base", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

// original saves a capture as the tunnel would have.
func original(t *testing.T, a *Agent, path, body string, edit func(*agentdb.Capture)) *agentdb.Capture {
	t.Helper()
	c := a.newCapture(SourceTunnel, "POST", path, wire.Header{{Name: "X-Secret", Value: "old"}, {Name: "X-Other", Value: "1"}}, []byte(body))
	if edit != nil {
		edit(c)
	}
	if err := a.cm.save(context.Background(), writeOp{insert: c}); err != nil {
		t.Fatal(err)
	}
	return c
}

// A replay sends the original, or its edited method, path, headers and
// body, to the handler (or "to"), and is saved as a replay of it with the
// handler's answer.
func TestReplayWithEdits(t *testing.T) {
	h := &seen{}
	a := runAgent(t, h)
	orig := original(t, a, "/hook?q=1", `{"a":1}`, nil)
	ctx := context.Background()
	c, err := a.ReplayAndWait(ctx, ReplayOptions{ID: orig.ID})
	if err != nil {
		t.Fatal(err)
	}
	method, path, body := "PUT", "/other?x=2", `{"b":2}`
	headers := wire.Header{{Name: "X-Secret", Value: "new"}}
	edited, err := a.ReplayAndWait(ctx, ReplayOptions{ID: orig.ID, Method: &method, Path: &path, Headers: &headers, Body: &body})
	if err != nil {
		t.Fatal(err)
	}
	got := h.all()
	want := []string{`POST /base/hook?q=1 old {"a":1}`, `PUT /base/other?x=2 new {"b":2}`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the handler got %q, want %q", got, want)
	}
	for _, r := range []*agentdb.Capture{c, edited} {
		stored, err := a.store.Capture(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if stored.ReplayOf != orig.ID || stored.Source != SourceReplay || stored.ResponseStatus != http.StatusAccepted || stored.Attempts != 1 {
			t.Errorf("stored replay: of %q, source %s, response %d, %d attempts", stored.ReplayOf, stored.Source, stored.ResponseStatus, stored.Attempts)
		}
	}
	to := strings.TrimSuffix(a.forwardTo.String(), "/base") + "/elsewhere"
	if _, err := a.ReplayAndWait(ctx, ReplayOptions{ID: orig.ID, To: to}); err != nil {
		t.Fatal(err)
	}
	if got := h.all(); len(got) != 3 || !strings.HasPrefix(got[2], "POST /elsewhere ") {
		t.Errorf("a replay to another URL reached %q", got[len(got)-1])
	}
}

// A replay the agent cannot make is refused with a clear error, and
// nothing reaches the handler.
func TestReplayRefusesBadEdits(t *testing.T) {
	h := &seen{}
	a := runAgent(t, h)
	orig := original(t, a, "/hook", `{}`, nil)
	str := func(s string) *string { return &s }
	hdr := func(name string) *wire.Header { return &wire.Header{{Name: name, Value: "v"}} }
	for name, o := range map[string]ReplayOptions{
		"unknown id":          {ID: "nope"},
		"method with a space": {Method: str("GET X")},
		"empty method":        {Method: str("")},
		"method separator":    {Method: str("GE/T")},
		"method control":      {Method: str("GE\x7fT")},
		"path not rooted":     {Path: str("hook")},
		"empty path":          {Path: str("")},
		"dot segment":         {Path: str("/a/../b?x=1")},
		"header name":         {Headers: hdr("X Bad")},
		"header name colon":   {Headers: hdr("X:Bad")},
		"retry":               {Retry: "always"},
		"time scale":          {TimeScale: -1},
		"bad to":              {To: "ftp://x"},
	} {
		if o.ID == "" {
			o.ID = orig.ID
		}
		if _, err := a.Replay(context.Background(), o); err == nil {
			t.Errorf("%s: replayed", name)
		}
	}
	if got := h.all(); len(got) != 0 {
		t.Errorf("the handler got %q", got)
	}
	if !validToken("PATCH") || !validToken("X-Ok_1~") {
		t.Error("a valid token was refused")
	}
}

// A replay of a capture that has no target, to an agent with no handler,
// says so.
func TestReplayWithoutTarget(t *testing.T) {
	d := openDisk(t)
	a, err := New(Config{Store: d.store, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := testCapture(`{}`)
	if _, err := d.store.WriteCaptures(context.Background(), []*agentdb.Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.prepareReplay(context.Background(), ReplayOptions{ID: c.ID}); err == nil || !strings.Contains(err.Error(), "no target") {
		t.Errorf("a replay with no target: %v", err)
	}
	a.cm.answers.timer.Stop()
}

// A call's replay re-fires its originals in their order (not the agent's
// replays, nor the service's retries unless asked), spaced as they first
// arrived times the scale, with the headers given in place of theirs.
func TestReplayCall(t *testing.T) {
	h := &seen{}
	a := runAgent(t, h)
	ctx := context.Background()
	t0 := time.Now().UTC().Add(-time.Minute)
	first := original(t, a, "/hook", `{"n":1}`, func(c *agentdb.Capture) { c.CallID, c.CreatedAt = "call-1", t0 })
	second := original(t, a, "/hook", `{"n":2}`, func(c *agentdb.Capture) {
		c.CallID, c.CreatedAt, c.ArrivedAt = "call-1", t0.Add(time.Hour), t0.Add(200*time.Millisecond)
	})
	original(t, a, "/hook", `{"n":3}`, func(c *agentdb.Capture) { c.CallID, c.DuplicateOf = "call-1", first.ID })
	original(t, a, "/hook", `{"other":true}`, func(c *agentdb.Capture) { c.CallID = "call-2" })
	if Arrival(second) != second.ArrivedAt || Arrival(first) != first.CreatedAt {
		t.Fatal("Arrival is not the relay's arrival, else the capture's creation")
	}
	o := CallReplayOptions{CallID: "call-1", TimeScale: 0.5, SetHeaders: wire.Header{{Name: "x-secret", Value: "given"}}}
	originals, err := a.CallOriginals(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(originals) != 2 {
		t.Fatalf("%d originals, want the two first deliveries", len(originals))
	}
	var replays []string
	start := time.Now()
	err = a.ReplayCall(ctx, originals, o, func(orig, replay *agentdb.Capture) {
		replays = append(replays, fmt.Sprintf("%s<-%v", orig.Body, replay.ReplayOf == orig.ID))
	})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("the replay took %s: the 200 ms gap times 0.5 was not kept", took)
	}
	if want := `[{"n":1}<-true {"n":2}<-true]`; fmt.Sprint(replays) != want {
		t.Errorf("replayed %s, want %s", replays, want)
	}
	if got := h.all(); len(got) != 2 || got[0] != `POST /base/hook given {"n":1}` || got[1] != `POST /base/hook given {"n":2}` {
		t.Errorf("the handler got %q", got)
	}
	o.WithRetries = true
	if all, err := a.CallOriginals(ctx, o); err != nil || len(all) != 3 {
		t.Errorf("with retries: %d originals (%v), want 3", len(all), err)
	}
	if _, err := a.CallOriginals(ctx, CallReplayOptions{CallID: "call-9"}); err == nil {
		t.Error("a call with no capture was not refused")
	}
	n, err := a.ReplayCallInBackground(ctx, CallReplayOptions{CallID: "call-2"})
	if err != nil || n != 1 {
		t.Fatalf("in the background: %d, %v", n, err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(h.all()) < 3 && time.Now().Before(deadline); {
		a.Flush(ctx)
	}
	if got := h.all(); len(got) != 3 || got[2] != `POST /base/hook old {"other":true}` {
		t.Errorf("the background replay: handler got %q", got)
	}
}

// withHeaders puts each field given in place of the first of its name
// (any case), drops the others of that name, and adds the rest at the end.
func TestWithHeaders(t *testing.T) {
	stored := `[["A","1"],["B","2"],["a","3"],["C","4"]]`
	got := withHeaders(stored, wire.Header{{Name: "a", Value: "x"}, {Name: "D", Value: "y"}, {Name: "A", Value: "z"}})
	want := wire.Header{{Name: "A", Value: "x"}, {Name: "A", Value: "z"}, {Name: "B", Value: "2"}, {Name: "C", Value: "4"}, {Name: "D", Value: "y"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("withHeaders = %v, want %v", got, want)
	}
}
