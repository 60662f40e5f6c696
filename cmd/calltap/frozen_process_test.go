package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
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
// every request, each sender's in the order it sent them. A request that
// had waited for the agent would have got the handler's answer, and only
// after SIGCONT. (Woken after more than its own wait for the relay, 6 s,
// the agent reconnects: the requests it was sent live and never answered
// reach it as the copies the relay queued.)
//
// Each request reaches the handler once, one the stop caught at the agent
// too, between its arrival and its answer: its copy reaches the agent
// again on its next connection, which knows it for a live request it
// saved already (inspector/agent livecopy.go) and does not send it again.
func TestFrozenAgentUnderTrafficIsAway(t *testing.T) {
	const senders = 3
	tr := startTraffic(t, senders)
	polltest.Until(t, 30*time.Second, func() bool { return tr.count(http.StatusOK) >= 10 }, "the traffic did not reach the handler")

	// The lid closes for 15 s, then for 4.5 s: the agent, woken within its
	// own wait for the relay, reads on over the same connection what the
	// relay sent it before the verdict, and then the queue.
	var stops []lidClosed
	for _, d := range []time.Duration{15 * time.Second, 4500 * time.Millisecond} {
		x := lidClosed{from: time.Now()}
		tr.agent.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(d) // the lid stays closed this long
		x.to = time.Now()
		tr.agent.cmd.Process.Signal(syscall.SIGCONT)
		polltest.Until(t, 60*time.Second, func() bool { return tr.okSince(x.to) >= senders }, "live requests did not reach the agent again after it woke")
		stops = append(stops, x)
	}
	tr.halt()

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
	polltest.Until(t, 60*time.Second, func() bool { return len(sentBodies(tr.handler.get())) >= len(sends) }, "the handler did not get every request")
	for _, x := range checkPerSenderInOrder(t, sentBodies(tr.handler.get()), sends, senders) {
		t.Errorf("%s reached the handler twice", x.body)
	}
	if m := getBody(tr.relayURL + "/metrics"); !strings.Contains(m, fmt.Sprintf("calltap_agents_frozen_total %d\n", len(stops))) {
		t.Errorf("the relay did not count an agent taken for frozen at each stop:\n%s", m)
	}
	for _, st := range stops {
		wait, gap := tr.longestWaits(st)
		t.Logf("stopped %s (%d requests in all): the longest a sender waited %s; the longest stretch without a 2xx or 202 from the stop %s",
			st.to.Sub(st.from).Round(time.Millisecond), len(sends), wait.Round(time.Millisecond), gap.Round(time.Millisecond))
	}
}

// lidClosed is a stretch of time the agent was stopped.
type lidClosed struct{ from, to time.Time }

func (st lidClosed) holds(t time.Time) bool { return !t.Before(st.from) && t.Before(st.to) }

// traffic is a relay, an agent and its handler, and a few senders, each
// sending its requests to the agent's tunnel one after another, at a
// steady pace, until halted.
type traffic struct {
	handler  *counter
	agent    *proc
	agentDir string
	relayURL string
	url      string // the tunnel's
	stop     chan struct{}
	running  sync.WaitGroup

	mu    sync.Mutex
	sends []trafficSend // guarded by mu
}

// startTraffic starts a relay, an agent and its handler, and the senders
// once the tunnel is up.
func startTraffic(t *testing.T, senders int) *traffic {
	t.Helper()
	tr := &traffic{handler: &counter{}, stop: make(chan struct{})}
	hs := httptest.NewServer(tr.handler)
	t.Cleanup(hs.Close)
	rig := newStopRig(t)
	tr.relayURL, tr.agentDir = rig.relayURL, rig.agentDir
	tr.agent = rig.startAgent(t, hs.URL)
	tr.url = tunnelURL(t, tr.agent)
	polltest.Until(t, 15*time.Second, func() bool { return postStatus(tr.url, `{"warmup":true}`) == http.StatusOK }, "the tunnel did not come up")
	for s := range senders {
		tr.running.Go(func() { tr.run(s) })
	}
	t.Cleanup(tr.halt)
	return tr
}

// halt stops the senders, once their requests are answered.
func (tr *traffic) halt() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	tr.running.Wait()
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
		x := trafficSend{sender: sender, n: n, body: fmt.Sprintf(`{"id":"s%d-%d"}`, sender, n), sent: time.Now()}
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

// longestWaits are, over st, the longest a request waited for its answer
// (of those in flight at some time during st), and the longest time from
// st's start on without any answer of 2xx or 202.
func (tr *traffic) longestWaits(st lidClosed) (wait, gap time.Duration) {
	last := st.from
	for _, x := range tr.all() { // in the order they were answered
		if x.answered.Before(st.from) {
			continue
		}
		if x.sent.Before(st.to) {
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

// checkPerSenderInOrder checks that the handler got each request sent,
// each sender's first in the order it sent them, and none more than
// twice; it returns those it got twice.
func checkPerSenderInOrder(t *testing.T, got []string, sends []trafficSend, senders int) (repeats []trafficSend) {
	t.Helper()
	seen := map[string]int{}
	next := make([]int, senders)
	for _, b := range got {
		if seen[b]++; seen[b] > 1 {
			continue
		}
		var s, n int
		if _, err := fmt.Sscanf(b, `{"id":"s%d-%d"}`, &s, &n); err != nil || s < 0 || s >= senders {
			t.Fatalf("the handler got %q", b)
		}
		if n != next[s] {
			t.Errorf("sender %d: the handler got request %d when %d was next", s, n, next[s])
		}
		next[s] = n + 1
	}
	for _, x := range sends {
		switch seen[x.body] {
		case 1:
		case 2:
			repeats = append(repeats, x)
		default:
			t.Errorf("%s reached the handler %d times", x.body, seen[x.body])
		}
	}
	return repeats
}
