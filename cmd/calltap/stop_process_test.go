package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
)

// These tests stop the relay and the agent the orderly way (SIGTERM,
// SIGINT) in the middle of traffic: a stop must cost no sender an answer
// its handler gave, and leave nothing unsaved, twice, or out of order.

// echoHandler answers "ok:" and the body after delay, and records the
// order in which bodies reach it.
type echoHandler struct {
	delay time.Duration
	mu    sync.Mutex
	seen  []string
}

func (h *echoHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.seen = append(h.seen, string(b))
	h.mu.Unlock()
	time.Sleep(h.delay) // the handler's work
	io.WriteString(w, "ok:"+string(b))
}

func (h *echoHandler) order() map[string][]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string][]int{}
	for i, b := range h.seen {
		out[b] = append(out[b], i)
	}
	return out
}

func (h *echoHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.seen)
}

// sent is one sender's request and what it got.
type sent struct {
	body       string
	status     int // 0: no answer (connection refused or reset)
	retryAfter string
	answer     string
	start, end time.Time
}

func send(c *http.Client, url, body string) sent {
	s := sent{body: body, start: time.Now()}
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s.status, s.retryAfter, s.answer = resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
	}
	s.end = time.Now()
	return s
}

// stopRig is a relay process, a token and the agent's data directory.
type stopRig struct {
	relayArgs []string
	relay     *proc
	url       string // the tunnel's
	token     string
	relayURL  string
	agentDir  string
}

func newStopRig(t *testing.T, extra ...string) *stopRig {
	dir := t.TempDir()
	addr := freeAddr(t)
	r := &stopRig{relayURL: "http://" + addr, agentDir: t.TempDir()}
	r.relayArgs = append([]string{"relay", "--listen", addr, "--insecure-http", "--public-url", r.relayURL, "--data", dir,
		"--rate-limit", "100000", "--rate-burst", "100000"}, extra...)
	r.relay = start(t, r.relayArgs...)
	r.waitRelay(t)
	code, stdout, stderr := runCmd(t, "relay", "token", "create", "alice", "--data", dir, "--public-url", r.relayURL, "--json")
	if code != 0 {
		t.Fatalf("token create: %s", stderr)
	}
	var tok struct {
		Token string `json:"token"`
		URL   string `json:"url"`
	}
	json.Unmarshal([]byte(stdout), &tok)
	r.token, r.url = tok.Token, tok.URL
	return r
}

// waitRelay polls until the relay process answers its health check.
func (r *stopRig) waitRelay(t *testing.T) {
	t.Helper()
	polltest.Until(t, 60*time.Second, func() bool {
		resp, err := http.Get(r.relayURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "the relay did not come up")
}

func (r *stopRig) startAgent(t *testing.T, forwardTo string, extra ...string) *proc {
	args := append([]string{"listen", "--relay", r.relayURL, "--token", r.token, "--forward-to", forwardTo, "--inspect", "", "--data", r.agentDir}, extra...)
	return start(t, args...)
}

// stop signals p and waits for it to exit by itself, with status 0.
func stop(t *testing.T, p *proc, sig syscall.Signal) {
	t.Helper()
	p.cmd.Process.Signal(sig)
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("%s after %v: %v\n%s", p.cmd.Args[1], sig, err, p.out.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("%s did not exit within 90 s of %v\n%s", p.cmd.Args[1], sig, p.out.String())
	}
}

// storedBodies reads the tunnel captures of a stopped agent, by body.
func storedBodies(t *testing.T, dir string) (map[string][]*agentdb.Capture, []*agentdb.Capture) {
	t.Helper()
	ctx := context.Background()
	db, err := agentdb.OpenAgent(ctx, filepath.Join(dir, "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	byBody := map[string][]*agentdb.Capture{}
	var all []*agentdb.Capture
	if _, err := db.EachCapture(ctx, agentdb.CaptureFilter{Source: "tunnel"}, func(c *agentdb.Capture) error {
		if c.Body == nil {
			full, err := db.Capture(ctx, c.ID)
			if err != nil {
				return err
			}
			c = full
		}
		byBody[string(c.Body)] = append(byBody[string(c.Body)], c)
		all = append(all, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return byBody, all
}

// checkAnswers fails for an answer no handler gave: a 2xx other than the
// handler's own or 202, a 5xx without Retry-After, or anything else.
func checkAnswers(t *testing.T, results []sent) {
	t.Helper()
	for _, s := range results {
		switch {
		case s.status == http.StatusOK:
			if s.answer != "ok:"+s.body {
				t.Errorf("%s: 200 with %q, not the handler's answer", s.body, s.answer)
			}
		case s.status == http.StatusAccepted:
		case s.status >= 500:
			if s.retryAfter == "" {
				t.Errorf("%s: %d without Retry-After: %s", s.body, s.status, s.answer)
			}
		case s.status == 0:
		default:
			t.Errorf("%s: %d: %s", s.body, s.status, s.answer)
		}
	}
}

// waitDelivered waits until every request answered 2xx has reached h.
func waitDelivered(t *testing.T, h *echoHandler, results []sent) {
	t.Helper()
	polltest.Until(t, 90*time.Second, func() bool {
		seen := h.order()
		for _, s := range results {
			if s.status/100 == 2 && len(seen[s.body]) == 0 {
				return false
			}
		}
		return true
	}, "a request answered 2xx did not reach the handler")
}

// checkOnce fails for a request answered 2xx that did not reach the
// handler exactly once, or was not saved exactly once.
func checkOnce(t *testing.T, h *echoHandler, results []sent, stored map[string][]*agentdb.Capture) {
	t.Helper()
	seen := h.order()
	for _, s := range results {
		if s.status/100 != 2 {
			continue
		}
		if n := len(seen[s.body]); n != 1 {
			t.Errorf("%s (answered %d) reached the handler %d times", s.body, s.status, n)
		}
		if n := len(stored[s.body]); n != 1 {
			t.Errorf("%s (answered %d) saved %d times", s.body, s.status, n)
		}
	}
}

// A relay stopped with SIGTERM while senders stream gives every request in
// flight its handler's answer; what arrives after is refused with 503 and
// Retry-After; nothing answered 2xx is lost or saved twice.
func TestRelaySIGTERMAnswersEverySender(t *testing.T) {
	h := &echoHandler{delay: 300 * time.Millisecond}
	hs := httptest.NewServer(h)
	defer hs.Close()
	rig := newStopRig(t, "--stop-grace", "30s")
	agent := rig.startAgent(t, hs.URL)
	client := &http.Client{Timeout: 90 * time.Second}
	polltest.Until(t, 30*time.Second, func() bool { return send(client, rig.url, "probe").status == 200 }, "tunnel did not come up")

	var (
		mu      sync.Mutex
		results []sent
		senders sync.WaitGroup
		quit    = make(chan struct{})
	)
	for i := range 16 {
		senders.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-quit:
					return
				default:
				}
				s := send(client, rig.url, fmt.Sprintf("s%d-%d", i, n))
				mu.Lock()
				results = append(results, s)
				mu.Unlock()
				if s.status == 0 {
					return // the relay is gone
				}
			}
		})
	}
	polltest.Until(t, 60*time.Second, func() bool { return h.count() > 64 }, "traffic did not flow")
	stop(t, rig.relay, syscall.SIGTERM)
	close(quit)
	senders.Wait()

	checkAnswers(t, results)
	seen := h.order()
	for _, s := range results {
		if len(seen[s.body]) > 0 && s.status != http.StatusOK {
			t.Errorf("%s reached the handler, but its sender got %d %s", s.body, s.status, s.answer)
		}
	}
	// What was queued reaches the agent once the relay is back.
	rig.relay = start(t, rig.relayArgs...)
	waitDelivered(t, h, results)
	stop(t, agent, syscall.SIGTERM)
	stored, _ := storedBodies(t, rig.agentDir)
	checkOnce(t, h, results, stored)
	if t.Failed() {
		t.Logf("relay:\n%s", rig.relay.out.String())
	}
}

// An agent stopped with SIGINT while the relay's queue drains and senders
// stream: every sender gets its handler's answer or 202; no request that
// waited behind another reaches the handler before it; each one answered
// 2xx reaches the handler once and is saved once; no capture stays
// pending; an orderly stop logs no error.
func TestAgentStopKeepsOrderAndAnswers(t *testing.T) {
	h := &echoHandler{delay: 20 * time.Millisecond}
	hs := httptest.NewServer(h)
	defer hs.Close()
	rig := newStopRig(t)
	client := &http.Client{Timeout: 90 * time.Second}
	var results []sent
	for n := range 150 {
		s := send(client, rig.url, fmt.Sprintf("q-%d", n))
		if s.status != http.StatusAccepted {
			t.Fatalf("queueing: %d %s", s.status, s.answer)
		}
		results = append(results, s)
	}
	agent := rig.startAgent(t, hs.URL)
	var (
		mu      sync.Mutex
		senders sync.WaitGroup
		quit    = make(chan struct{})
	)
	for i := range 8 {
		senders.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-quit:
					return
				default:
				}
				s := send(client, rig.url, fmt.Sprintf("n%d-%d", i, n))
				mu.Lock()
				results = append(results, s)
				mu.Unlock()
				// A pace the handler keeps up with (8 senders, 40 a second
				// against its 50), so that the queue drains in the end.
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	polltest.Until(t, 60*time.Second, func() bool { return h.count() >= 40 }, "the queue did not start draining")
	stop(t, agent, syscall.SIGINT)
	first := agent.out.String()
	agent = rig.startAgent(t, hs.URL)
	polltest.Until(t, 60*time.Second, func() bool { return h.count() >= 200 }, "the agent did not resume")
	close(quit)
	senders.Wait()
	waitDelivered(t, h, results)
	stop(t, agent, syscall.SIGTERM)

	for _, out := range []string{first, agent.out.String()} {
		if strings.Contains(out, "level=ERROR") {
			t.Errorf("an orderly stop logged an error:\n%s", out)
		}
	}
	for _, s := range results {
		if s.status != http.StatusOK && s.status != http.StatusAccepted {
			t.Errorf("%s: %d %s", s.body, s.status, s.answer)
		}
	}
	checkAnswers(t, results)
	seen := h.order()
	// A request answered 202 waits; one sent after that answer must not
	// reach the handler before it.
	for _, q := range results {
		if q.status != http.StatusAccepted || len(seen[q.body]) == 0 {
			continue
		}
		for _, n := range results {
			if n.start.After(q.end) && len(seen[n.body]) > 0 && seen[n.body][0] < seen[q.body][0] {
				t.Errorf("%s (sent after %s was queued) reached the handler before it", n.body, q.body)
			}
		}
	}
	stored, all := storedBodies(t, rig.agentDir)
	checkOnce(t, h, results, stored)
	for _, c := range all {
		if c.Status == agentdb.StatusPending {
			t.Errorf("capture %s (%s) left pending", c.ID, c.Body)
		}
	}
}

// waitConnected polls the inspector at addr until its tunnel is connected.
func waitConnected(t *testing.T, addr string) {
	t.Helper()
	polltest.Until(t, 60*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/api/v1/ext/tunnel/")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(b), `"connected"`)
	}, "the tunnel did not come up")
}

// What the agent's package comment says: a sender's 2xx means saved; after
// a crash (SIGKILL) with a request at the handler, the sender is told to
// retry, the handler sees the request again with the same delivery id, the
// retry is saved as a duplicate of the first copy, and the first copy is
// marked answer unknown (its sender may have got the handler's answer: the
// agent cannot tell) instead of staying pending.
func TestAgentKilledMidRequestRetriedAsDuplicate(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var deliveries []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		deliveries = append(deliveries, string(b))
		first := len(deliveries) == 1
		mu.Unlock()
		if first {
			<-release // the agent is killed meanwhile
		}
		io.WriteString(w, "handled")
	}))
	defer hs.Close()
	defer close(release)
	rig := newStopRig(t)
	inspect := freeAddr(t)
	agent := start(t, "listen", "--relay", rig.relayURL, "--token", rig.token, "--forward-to", hs.URL, "--inspect", inspect, "--data", rig.agentDir)
	client := &http.Client{Timeout: 90 * time.Second}
	waitConnected(t, inspect)
	const body = `{"id":"dlv-kill-1","event":"call.started","occurred_at":"2026-01-01T00:00:00Z","call":{"call_id":"c-kill"}}`
	firstTry := make(chan sent, 1)
	go func() { firstTry <- send(client, rig.url, body) }()
	// The first copy is at the handler and committed.
	polltest.Until(t, 30*time.Second, func() bool {
		resp, err := http.Get("http://" + inspect + "/api/v1/ext/webhooks/?delivery_id=dlv-kill-1")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		mu.Lock()
		defer mu.Unlock()
		return len(deliveries) == 1 && strings.Contains(string(b), "dlv-kill-1")
	}, "the first copy was not saved and at the handler")
	agent.cmd.Process.Signal(syscall.SIGKILL)
	agent.cmd.Wait()
	s := <-firstTry
	if s.status < 500 || s.retryAfter == "" {
		t.Fatalf("sender of a request whose agent was killed got %d %s", s.status, s.answer)
	}
	// The sender retries once the agent is back (a retry while it is away
	// is queued, and delivered as one more copy: not this test's case).
	inspect = freeAddr(t)
	agent = rig.startAgent(t, hs.URL, "--inspect", inspect)
	waitConnected(t, inspect)
	if s = send(client, rig.url, body); s.status != http.StatusOK {
		t.Fatalf("the retry got %d %s, want the handler's answer", s.status, s.answer)
	}
	stop(t, agent, syscall.SIGTERM)
	mu.Lock()
	if len(deliveries) < 2 || deliveries[0] != body || deliveries[len(deliveries)-1] != body {
		t.Errorf("the handler saw %q", deliveries)
	}
	mu.Unlock()
	stored, _ := storedBodies(t, rig.agentDir)
	copies := stored[body]
	if len(copies) != 2 {
		t.Fatalf("%d copies saved, want the first and the retry", len(copies))
	}
	firstCopy, retry := copies[0], copies[1]
	if firstCopy.DuplicateOf != "" || retry.DuplicateOf != firstCopy.ID {
		t.Errorf("first duplicate_of %q, retry duplicate_of %q, want %q", firstCopy.DuplicateOf, retry.DuplicateOf, firstCopy.ID)
	}
	if firstCopy.Status != agentdb.StatusUnknown || !strings.Contains(firstCopy.Error, "may have got the handler's answer") {
		t.Errorf("first copy: status %s, error %q; want unknown, saying the sender may have got the answer", firstCopy.Status, firstCopy.Error)
	}
	if retry.Status != agentdb.StatusDelivered || retry.ResponseStatus != 200 {
		t.Errorf("retry: status %s, response %d", retry.Status, retry.ResponseStatus)
	}
}

// The agent's intake log under a kill: SIGKILL while eight senders keep it
// busy. Every request its sender got 200 for is in the store once the
// store is opened again (by anyone: here the test, as a CLI command
// would), exactly once; nothing is stored twice.
func TestAgentKilledUnderLoadKeepsEveryAnswered(t *testing.T) {
	h := &echoHandler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	rig := newStopRig(t)
	inspect := freeAddr(t)
	agent := rig.startAgent(t, hs.URL, "--inspect", inspect)
	waitConnected(t, inspect)
	client := &http.Client{Timeout: 60 * time.Second}
	var (
		mu      sync.Mutex
		results []sent
		ok      int
		halt    atomic.Bool
		wg      sync.WaitGroup
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !halt.Load(); i++ {
				s := send(client, rig.url, fmt.Sprintf(`{"sender":%d,"n":%d}`, g, i))
				mu.Lock()
				results = append(results, s)
				if s.status == http.StatusOK {
					ok++
				}
				mu.Unlock()
			}
		}()
	}
	polltest.Until(t, 2*time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ok >= 300
	}, "the senders did not get 300 answers")
	agent.cmd.Process.Signal(syscall.SIGKILL)
	agent.cmd.Wait()
	halt.Store(true)
	wg.Wait()
	stored, all := storedBodies(t, rig.agentDir)
	answered := 0
	for _, s := range results {
		if s.status != http.StatusOK {
			continue
		}
		answered++
		if n := len(stored[s.body]); n != 1 {
			t.Errorf("%s was answered 200 and is stored %d times", s.body, n)
		}
	}
	for body, cs := range stored {
		if len(cs) > 1 {
			t.Errorf("%s is stored %d times", body, len(cs))
		}
	}
	t.Logf("%d requests answered 200 before the kill, %d captures after it", answered, len(all))
}
