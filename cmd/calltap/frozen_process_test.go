package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
)

// A laptop whose lid closes under steady traffic: the agent is stopped
// (SIGSTOP) for 15 s while its connection stays open, and the relay's
// pong wait (30 s) and forward timeout (30 s) both outlast the stop. No
// sender waits for it: each request sent during the stop is answered 202,
// as for an agent away, and once it runs again (SIGCONT) the handler gets
// every request exactly once, each sender's in the order it sent them.
// A request that had waited for the agent would have got the handler's
// answer, and only after SIGCONT. (Woken after more than its own wait for
// the relay, 6 s, the agent reconnects: the requests it was sent live and
// never read reach it as the copies the relay queued.)
func TestFrozenAgentUnderTrafficIsAway(t *testing.T) {
	h := &counter{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	relayDir := t.TempDir()
	relayAddr := freeAddr(t)
	relayURL := "http://" + relayAddr
	start(t, "relay", "--listen", relayAddr, "--insecure-http", "--public-url", relayURL, "--data", relayDir)
	code, stdout, stderr := runCmd(t, "relay", "token", "create", "alice", "--data", relayDir, "--public-url", relayURL)
	if code != 0 {
		t.Fatalf("token create: %s", stderr)
	}
	token := regexp.MustCompile(`ct_\S+`).FindString(stdout)
	agent := start(t, "listen", "--relay", relayURL, "--token", token, "--forward-to", hs.URL, "--inspect", "", "--data", t.TempDir())
	url := tunnelURL(t, agent)
	polltest.Until(t, 15*time.Second, func() bool { return postStatus(url, `{"warmup":true}`) == http.StatusOK }, "the tunnel did not come up")

	tr := &traffic{url: url, stop: make(chan struct{})}
	const senders = 3
	var running sync.WaitGroup
	for s := range senders {
		running.Go(func() { tr.run(s) })
	}
	polltest.Until(t, 30*time.Second, func() bool { return tr.count(http.StatusOK) >= 10 }, "the traffic did not reach the handler")

	// The lid closes for 15 s, then for 4.5 s: the agent, woken within its
	// own wait for the relay, reads on over the same connection what the
	// relay sent it before the verdict, and then the queue.
	var stops []lidClosed
	for _, d := range []time.Duration{15 * time.Second, 4500 * time.Millisecond} {
		x := lidClosed{from: time.Now()}
		agent.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(d) // the lid stays closed this long
		x.to = time.Now()
		agent.cmd.Process.Signal(syscall.SIGCONT)
		polltest.Until(t, 60*time.Second, func() bool { return tr.okSince(x.to) >= senders }, "live requests did not reach the agent again after it woke")
		stops = append(stops, x)
	}
	close(tr.stop)
	running.Wait()

	sends := tr.all()
	for _, x := range sends {
		if x.status != http.StatusOK && x.status != http.StatusAccepted {
			t.Errorf("%s: answered %d, want 200 or 202", x.body, x.status)
		}
		for _, st := range stops {
			if st.holds(x.sent) && x.status != http.StatusAccepted {
				t.Errorf("%s, sent during a stop: answered %d, want 202 (it waited for the frozen agent)", x.body, x.status)
			}
		}
	}
	polltest.Until(t, 60*time.Second, func() bool { return len(sentBodies(h.get())) >= len(sends) }, "the handler did not get every request")
	checkOncePerSenderInOrder(t, sentBodies(h.get()), sends, senders)
	if m := getBody(relayURL + "/metrics"); !strings.Contains(m, fmt.Sprintf("calltap_agents_frozen_total %d\n", len(stops))) {
		t.Errorf("the relay did not count an agent taken for frozen at each stop:\n%s", m)
	}
	for _, st := range stops {
		wait, gap := tr.longestWaits(st)
		t.Logf("stopped %s (%d requests in all): the longest a sender waited during the stop %s; the longest stretch without a 2xx or 202 from the stop %s",
			st.to.Sub(st.from).Round(time.Millisecond), len(sends), wait.Round(time.Millisecond), gap.Round(time.Millisecond))
	}
}

// lidClosed is a stretch of time the agent was stopped.
type lidClosed struct{ from, to time.Time }

func (st lidClosed) holds(t time.Time) bool { return !t.Before(st.from) && t.Before(st.to) }

// traffic is a few senders, each sending its requests one after another,
// at a steady pace, until stop is closed.
type traffic struct {
	url  string
	stop chan struct{}

	mu    sync.Mutex
	sends []trafficSend // guarded by mu
}

type trafficSend struct {
	sender, n      int
	body           string
	sent, answered time.Time
	status         int
}

func (tr *traffic) run(sender int) {
	pace := time.NewTicker(50 * time.Millisecond)
	defer pace.Stop()
	for n := 0; ; n++ {
		select {
		case <-tr.stop:
			return
		case <-pace.C:
		}
		x := trafficSend{sender: sender, n: n, body: fmt.Sprintf(`{"sender":%d,"n":%d}`, sender, n), sent: time.Now()}
		x.status = postStatus(tr.url, x.body)
		x.answered = time.Now()
		tr.mu.Lock()
		tr.sends = append(tr.sends, x)
		tr.mu.Unlock()
	}
}

func (tr *traffic) all() []trafficSend {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]trafficSend(nil), tr.sends...)
}

func (tr *traffic) count(status int) int {
	n := 0
	for _, x := range tr.all() {
		if x.status == status {
			n++
		}
	}
	return n
}

// okSince counts the requests sent after t that the handler answered.
func (tr *traffic) okSince(t time.Time) int {
	n := 0
	for _, x := range tr.all() {
		if x.sent.After(t) && x.status == http.StatusOK {
			n++
		}
	}
	return n
}

// longestWaits are, over st, the longest a request sent during it waited
// for its answer, and the longest time from its start on without any
// answer of 2xx or 202.
func (tr *traffic) longestWaits(st lidClosed) (wait, gap time.Duration) {
	last := st.from
	for _, x := range tr.all() { // in the order they were answered
		if x.answered.Before(st.from) {
			continue
		}
		if st.holds(x.sent) {
			wait = max(wait, x.answered.Sub(x.sent))
		}
		if x.status/100 == 2 && last.Before(st.to) {
			gap = max(gap, x.answered.Sub(last))
			last = x.answered
		}
	}
	return wait, gap
}

// sentBodies are the bodies the handler got from the traffic, without
// the warm-up's.
func sentBodies(got []string) []string {
	var out []string
	for _, b := range got {
		if !strings.Contains(b, "warmup") {
			out = append(out, b)
		}
	}
	return out
}

// checkOncePerSenderInOrder checks that the handler got each request
// sent exactly once, and each sender's in the order it sent them.
func checkOncePerSenderInOrder(t *testing.T, got []string, sends []trafficSend, senders int) {
	t.Helper()
	seen := map[string]int{}
	next := make([]int, senders)
	for _, b := range got {
		seen[b]++
		var s, n int
		if _, err := fmt.Sscanf(b, `{"sender":%d,"n":%d}`, &s, &n); err != nil || s < 0 || s >= senders {
			t.Fatalf("the handler got %q", b)
		}
		if n != next[s] && seen[b] == 1 {
			t.Errorf("sender %d: the handler got request %d when %d was next", s, n, next[s])
		}
		next[s] = n + 1
	}
	for _, x := range sends {
		if seen[x.body] != 1 {
			t.Errorf("%s reached the handler %d times", x.body, seen[x.body])
		}
	}
}
