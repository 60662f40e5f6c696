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
	"github.com/calltap/calltap/storage/agentdb"
)

// The store says only what it knows. The agent answers a live request
// before it records the handler's answer (the answer path waits for one
// sync, not two), so a SIGKILL just after a sender got its 200 leaves a
// capture whose answer was never recorded. After the restart such a
// capture is "unknown", saying the sender may have got the handler's
// answer: never a failure its sender did not see. Twenty rounds, each
// killing the agent at once after a 200 reached a sender.
func TestAgentKilledAfterAnswerClaimsNoFailure(t *testing.T) {
	h := &echoHandler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	// Refused while no agent is connected, so that every capture is a
	// live request.
	rig := newStopRig(t, "--offline", "reject")
	client := &http.Client{Timeout: 60 * time.Second}
	var (
		mu      sync.Mutex
		got     = map[string][]int{} // each body's answers, in order
		agent   *proc
		killed  = make(chan time.Duration, 1) // from a 200 to the SIGKILL's sending
		halt    = make(chan struct{})
		senders sync.WaitGroup
	)
	for g := range 4 {
		senders.Go(func() {
			for n := 0; ; n++ {
				body := fmt.Sprintf("c%d-%d", g, n)
				for { // like the service: again until it gets a 2xx
					select {
					case <-halt:
						return
					default:
					}
					s := send(client, rig.url, body)
					mu.Lock()
					if s.status == http.StatusOK && agent != nil {
						agent.cmd.Process.Signal(syscall.SIGKILL)
						killed <- time.Since(s.end)
						agent = nil
					}
					got[body] = append(got[body], s.status)
					mu.Unlock()
					if s.status/100 == 2 {
						break
					}
					if s.status != http.StatusOK {
						time.Sleep(5 * time.Millisecond)
					}
				}
			}
		})
	}
	const rounds = 20
	for range rounds {
		p := rig.startAgent(t, hs.URL)
		mu.Lock()
		agent = p
		mu.Unlock()
		select {
		case d := <-killed:
			if d > 2*time.Millisecond {
				t.Logf("SIGKILL %v after a 200", d)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("no request was answered 200 within 60 s of the agent's start")
		}
		p.cmd.Wait()
	}
	close(halt)
	senders.Wait()
	// A start marks what the killed run left; an orderly stop leaves
	// nothing pending.
	p := rig.startAgent(t, hs.URL)
	polltest.Until(t, 60*time.Second, func() bool { return send(client, rig.url, "last").status == http.StatusOK }, "the agent did not come back")
	stop(t, p, syscall.SIGTERM)

	stored, all := storedBodies(t, rig.agentDir)
	unknown := 0
	for _, c := range all {
		switch c.Status {
		case agentdb.StatusDelivered:
			if c.ResponseStatus != http.StatusOK {
				t.Errorf("%s: delivered with %d recorded; the handler answers 200", c.Body, c.ResponseStatus)
			}
		case agentdb.StatusUnknown:
			unknown++
			if !strings.Contains(c.Error, "may have got the handler's answer") {
				t.Errorf("%s: answer unknown, with %q", c.Body, c.Error)
			}
		default: // the handler never fails: a failure here is one no sender saw
			t.Errorf("%s: %s with %q; its sender got %v", c.Body, c.Status, c.Error, got[string(c.Body)])
		}
	}
	for body, statuses := range got {
		if statuses[len(statuses)-1] == http.StatusOK && len(stored[body]) == 0 {
			t.Errorf("%s was answered 200 and not stored", body)
		}
	}
	// calltap requests shows them apart from failures.
	code, out, errOut := runCmd(t, "requests", "--data", rig.agentDir, "--limit", "200")
	if code != 0 {
		t.Fatalf("calltap requests: %d %s", code, errOut)
	}
	if strings.Count(out, "answer-unknown") != unknown || strings.Contains(out, "failed") {
		t.Errorf("calltap requests shows %d answer-unknown (want %d), failed %v:\n%s", strings.Count(out, "answer-unknown"), unknown, strings.Contains(out, "failed"), out)
	}
	if unknown == 0 {
		t.Errorf("no capture was left without its answer in %d kills just after a 200: the test did not test", rounds)
	}
	t.Logf("%d captures, %d of them answer unknown", len(all), unknown)
}
