package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
)

// A relay node of three is killed (SIGKILL) while it holds an agent,
// answers requests and drains a queue; another tunnel's queue waits in
// the stream. Senders act as the voice service does: a request without a
// 2xx (or 202) answer is sent again, same payload and delivery id, to
// whichever node DNS gives next. Nothing answered 2xx or 202 is lost, and
// a retry of a request the dead node had delivered but never answered is
// saved as a duplicate of the first copy, not as a second delivery.
func TestClusterNodeKilled(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes, urls := startNodes(t, nats)
	aliceTok, aliceID := clusterToken(t, nats, "alice")
	bobTok, bobID := clusterToken(t, nats, "bob")

	h := newEventHandler()
	hs := httptest.NewServer(h)
	defer hs.Close()
	defer h.release()

	// Bob's agent is away: his requests wait in the stream, sent to every node.
	var bobWant []string
	for i := range 9 {
		id := fmt.Sprintf("bob_%d", i)
		if code := postStatus(urls[i%3]+"/t/"+bobID, callEvent(id)); code != http.StatusAccepted {
			t.Fatalf("bob's %s via node %d: %d, want 202", id, i%3, code)
		}
		bobWant = append(bobWant, id)
	}

	// Alice's agent knows all three nodes and reaches n0 first. A queue of
	// hers is held too: sent before it connects, drained while n0 dies.
	s := &senders{urls: urls, path: "/t/" + aliceID}
	for range 20 {
		s.send(t)
	}
	aliceDir := t.TempDir()
	alice := start(t, "listen", "--relay", strings.Join(urls, ","), "--token", aliceTok, "--forward-to", hs.URL, "--inspect", "", "--data", aliceDir)
	polltest.Until(t, 15*time.Second, func() bool { return postStatus(urls[0]+"/t/"+aliceID, callEvent("alice_up")) == http.StatusOK }, "alice's agent did not connect to n0")
	s.accept("alice_up")

	// Traffic from four senders throughout.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond): // about the service's pace, not a flood
					s.send(t)
				}
			}
		})
	}
	// Two requests in flight on n0 when it dies: one sent to n0 itself,
	// one sent to n1 and forwarded to n0. The agent has saved both and the
	// handler holds them.
	var retried sync.Map // in-flight ids whose sender had to try again
	for i, u := range urls[:2] {
		id := fmt.Sprintf("alice_inflight_%d", i)
		wg.Go(func() {
			if tries := s.deliver(t, u, id, callEvent(id+`","hold":"yes`)); tries > 1 {
				retried.Store(id, true)
			}
		})
		polltest.Until(t, 10*time.Second, func() bool { return h.count(id) == 1 }, id+" did not reach the handler")
	}
	s.waitAccepted(t, 60)
	before := strings.Count(alice.out.String(), "relay connection lost")
	nodes[0].cmd.Process.Signal(syscall.SIGKILL)
	nodes[0].cmd.Wait()
	h.release()

	// The agent notices, waits at most 2 s and reaches a live node (the
	// next it was given) on its first try.
	polltest.Until(t, 15*time.Second, func() bool {
		return strings.Contains(getBody(urls[1]+"/metrics"), "\ncalltap_tunnels_connected 1\n")
	}, "alice's agent did not reconnect to n1")
	logs := alice.out.String()
	lost := regexp.MustCompile(`relay connection lost.* in=([0-9.]+m?s)`).FindAllStringSubmatch(logs, -1)
	if len(lost) != before+1 {
		t.Errorf("the agent lost its connection %d times after n0 died, want once (then reconnected to a live node):\n%s", len(lost)-before, logs)
	} else if d, err := time.ParseDuration(lost[before][1]); err != nil || d > 2*time.Second {
		t.Errorf("the agent waited %s before reconnecting, want at most 2 s", lost[before][1])
	}
	s.waitAccepted(t, s.acceptedCount()+60)
	close(stop)
	wg.Wait()

	bob := start(t, "listen", "--relay", strings.Join(urls[1:], ","), "--token", bobTok, "--forward-to", hs.URL, "--inspect", "", "--data", t.TempDir())
	polltest.Until(t, 20*time.Second, func() bool { return h.count(bobWant[len(bobWant)-1]) > 0 }, "bob's queue was not delivered after n0 died")
	bob.cmd.Process.Signal(syscall.SIGTERM)
	bob.cmd.Wait()

	accepted := s.acceptedIDs()
	polltest.Until(t, 20*time.Second, func() bool {
		for _, id := range accepted {
			want := 1
			if _, ok := retried.Load(id); ok {
				want = 2 // the first copy and the sender's retry, which may have been queued
			}
			if h.count(id) < want {
				return false
			}
		}
		return true
	}, "a request answered 2xx or 202 never reached the handler (an in-flight one: twice)")
	alice.cmd.Process.Signal(syscall.SIGTERM)
	alice.cmd.Wait()

	// In alice's store: every accepted delivery once as itself; any copy
	// the relays sent again is marked a duplicate of it.
	db, err := agentdb.OpenAgent(context.Background(), filepath.Join(aliceDir, "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cs, err := db.CapturesAfter(context.Background(), agentdb.CaptureFilter{}, 0, 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]int{}
	for _, c := range cs {
		if c.DeliveryID == "" {
			t.Errorf("capture %s has no delivery id: %.200s", c.ID, c.Body)
		} else if c.DuplicateOf == "" {
			first[c.DeliveryID]++
		}
	}
	for _, id := range accepted {
		if first[id] != 1 {
			t.Errorf("delivery %s saved %d times as itself, want once", id, first[id])
		}
	}
	for i := range 2 {
		id := fmt.Sprintf("alice_inflight_%d", i)
		// One answered 202 at once (queued behind the other at the
		// handler) is the agent's to deliver: its sender has no reason to
		// send it again.
		if _, ok := retried.Load(id); !ok {
			continue
		}
		if n := h.count(id); n < 2 {
			t.Errorf("%s reached the handler %d times: the sender's retry of the unanswered request should arrive too", id, n)
		}
	}
	for _, id := range bobWant {
		if n := h.count(id); n != 1 {
			t.Errorf("bob's %s reached the handler %d times, want once", id, n)
		}
	}

	// The token commands work against the cluster: list, revoke, and the
	// revoked URL answers 404 on every live node.
	code, stdout, stderr := runCmd(t, "relay", "token", "list", "--nats", nats.URLs())
	if code != 0 || !strings.Contains(stdout, "alice") || !strings.Contains(stdout, "bob") || strings.Contains(stdout, bobTok) {
		t.Errorf("token list --nats: %d %q %s", code, stdout, stderr)
	}
	if code, _, stderr := runCmd(t, "relay", "token", "revoke", "bob", "--nats", nats.URLs()); code != 0 {
		t.Fatalf("token revoke --nats: %d %s", code, stderr)
	}
	for _, u := range urls[1:] {
		polltest.Until(t, 5*time.Second, func() bool { return postStatus(u+"/t/"+bobID, callEvent("bob_after")) == http.StatusNotFound },
			"bob's URL does not answer 404 on "+u+" after token revoke --nats")
	}
	if code, stdout, _ := runCmd(t, "relay", "token", "list", "--nats", nats.URLs(), "--json"); code != 0 || !strings.Contains(stdout, `"revoked_at":"`) {
		t.Errorf("token list --nats --json after revoke: %s", stdout)
	}
}

// startNodes starts three relay processes over nats, n0 to n2, and waits
// until each answers its health check.
func startNodes(t *testing.T, nats *natstest.Cluster) (nodes []*proc, urls []string) {
	t.Helper()
	for i := range 3 {
		addr := freeAddr(t)
		u := "http://" + addr
		urls = append(urls, u)
		nodes = append(nodes, start(t, "relay", "--nats", nats.URLs(), "--nats-replicas", "3", "--node", fmt.Sprintf("n%d", i),
			"--listen", addr, "--insecure-http", "--public-url", u, "--data", t.TempDir(),
			"--pong-wait", "2s", "--forward-timeout", "3s", "--rate-limit", "10000", "--rate-burst", "10000"))
	}
	for _, u := range urls {
		polltest.Until(t, 2*time.Minute, func() bool { return getStatus(u+"/healthz") == http.StatusOK }, u+" did not come up")
	}
	return nodes, urls
}

// clusterToken creates a token for name with `relay token create --nats`.
func clusterToken(t *testing.T, nats *natstest.Cluster, name string) (token, tunnelID string) {
	t.Helper()
	code, stdout, stderr := runCmd(t, "relay", "token", "create", name, "--nats", nats.URLs(), "--json")
	if code != 0 {
		t.Fatalf("token create %s: %s", name, stderr)
	}
	var tok struct {
		Token    string `json:"token"`
		TunnelID string `json:"tunnel_id"`
	}
	if err := json.Unmarshal([]byte(stdout), &tok); err != nil || tok.TunnelID == "" {
		t.Fatalf("token create %s printed %q", name, stdout)
	}
	return tok.Token, tok.TunnelID
}

// A relay node frozen (SIGSTOP) while it holds an agent: the agent leaves
// it within 10 s for another node (its keepalive allows a relay 6 s of
// silence, then it reconnects), and a sender on another node is answered
// within 5 s meanwhile: live, 202, or 503 with Retry-After, never a hang.
func TestFrozenRelayNodeIsLeft(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes, urls := startNodes(t, nats)
	tok, id := clusterToken(t, nats, "alice")
	h := newEventHandler()
	hs := httptest.NewServer(h)
	defer hs.Close()
	alice := start(t, "listen", "--relay", strings.Join(urls, ","), "--token", tok, "--forward-to", hs.URL, "--inspect", "", "--data", t.TempDir())
	polltest.Until(t, 30*time.Second, func() bool { return postStatus(urls[0]+"/t/"+id, callEvent("up")) == http.StatusOK }, "the agent did not connect to n0")

	frozen := nodes[0].cmd.Process
	frozen.Signal(syscall.SIGSTOP)
	froze := time.Now()
	t.Cleanup(func() { frozen.Signal(syscall.SIGCONT) })

	client := &http.Client{Timeout: 60 * time.Second} // bounds a hang; the 5 s is checked below
	sent := time.Now()
	resp, err := client.Post(urls[1]+"/t/"+id, "application/json", strings.NewReader(callEvent("during")))
	if err != nil {
		t.Fatalf("a sender on n1 while n0 is frozen: %v", err)
	}
	resp.Body.Close()
	took := time.Since(sent)
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "":
		t.Errorf("a sender on n1 while n0 is frozen got 503 without Retry-After")
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusServiceUnavailable:
		t.Errorf("a sender on n1 while n0 is frozen got %d, want 200, 202 or 503 + Retry-After", resp.StatusCode)
	}
	if took > 5*time.Second {
		t.Errorf("a sender on n1 while n0 is frozen waited %s for its answer, want at most 5 s", took.Round(time.Millisecond))
	}

	var moved time.Duration
	polltest.Until(t, 60*time.Second, func() bool {
		for _, u := range urls[1:] {
			if strings.Contains(getBody(u+"/metrics"), "\ncalltap_tunnels_connected 1\n") {
				moved = time.Since(froze)
				return true
			}
		}
		return false
	}, "the agent did not leave the frozen node")
	if moved > 10*time.Second {
		t.Errorf("the agent left the frozen node after %s, want within 10 s:\n%s", moved.Round(time.Millisecond), alice.out.String())
	}
	// On its new node the tunnel answers live again.
	polltest.Until(t, 30*time.Second, func() bool { return postStatus(urls[1]+"/t/"+id, callEvent("after")) == http.StatusOK }, "the tunnel did not answer live from n1")
	if t.Failed() {
		t.Logf("agent:\n%s", alice.out.String())
	}
}

func getBody(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func getStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// callEvent is a call.started event whose delivery id is id.
func callEvent(id string) string {
	return `{"id":"` + id + `","event":"call.started","occurred_at":"2026-11-24T10:00:00Z","call":{"call_id":"call_1"}}`
}

// senders send call events to the nodes in turn, as the service would
// through DNS round robin, and resend each until it is accepted.
type senders struct {
	urls []string
	path string

	mu       sync.Mutex
	next     int      // guarded by mu
	accepted []string // guarded by mu
}

func (s *senders) send(t *testing.T) {
	s.mu.Lock()
	n := s.next
	s.next++
	s.mu.Unlock()
	id := fmt.Sprintf("alice_%d", n)
	s.deliver(t, s.urls[n%len(s.urls)], id, callEvent(id))
}

// deliver sends body until a node answers 2xx or 202, first to url, then
// to the nodes in turn, retrying on what the service retries on, and
// returns how many tries it took. It may run in any goroutine.
func (s *senders) deliver(t *testing.T, url, id, body string) (tries int) {
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; ; i++ {
		u := url
		if i > 0 {
			u = s.urls[i%len(s.urls)]
		}
		tries = i + 1
		code := postStatus(u+s.path, body)
		switch {
		case code >= 200 && code < 300:
			s.accept(id)
			return
		case code != 0 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests && code < 500:
			t.Errorf("%s via %s: %d, which the service would not retry", id, u, code)
			return
		case time.Now().After(deadline):
			t.Errorf("%s was never accepted: last answer %d", id, code)
			return
		}
		// The service waits 30 s before its second try; a moment here.
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *senders) accept(id string) {
	s.mu.Lock()
	s.accepted = append(s.accepted, id)
	s.mu.Unlock()
}

func (s *senders) acceptedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.accepted)
}

func (s *senders) acceptedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.accepted...)
}

func (s *senders) waitAccepted(t *testing.T, n int) {
	t.Helper()
	polltest.Until(t, 60*time.Second, func() bool { return s.acceptedCount() >= n }, fmt.Sprintf("fewer than %d requests accepted", n))
}

// eventHandler counts the deliveries it sees by id and holds those marked
// "hold" until released.
type eventHandler struct {
	mu      sync.Mutex
	seen    map[string]int // guarded by mu
	hold    chan struct{}
	release func()
}

func newEventHandler() *eventHandler {
	h := &eventHandler{seen: map[string]int{}, hold: make(chan struct{})}
	h.release = sync.OnceFunc(func() { close(h.hold) })
	return h
}

func (h *eventHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var ev struct {
		ID   string `json:"id"`
		Hold string `json:"hold"`
	}
	b, _ := io.ReadAll(r.Body)
	json.Unmarshal(b, &ev)
	h.mu.Lock()
	h.seen[ev.ID]++
	h.mu.Unlock()
	if ev.Hold != "" {
		<-h.hold
	}
}

func (h *eventHandler) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[id]
}
