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
	"github.com/calltap/calltap/storage/disktest"
)

// An agent whose data folder fills up (a real, size-limited file system)
// while senders stream, each sending a request again until it gets a 2xx
// as the voice service does:
//   - it refuses them with 503, Retry-After and "disk full", before they
//     reach the handler: no request reaches the handler more than twice;
//   - an orderly stop, the disk still full, exits cleanly;
//   - started again with room, it takes requests at once, and its store
//     has nothing pending or answer-unknown: each capture says what its
//     sender got.
func TestAgentOnFullDisk(t *testing.T) {
	h := &echoHandler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	rig := newStopRig(t, "--offline", "reject")
	rig.agentDir = disktest.Dir(t, 48<<20)
	agent := rig.startAgent(t, hs.URL)
	client := &http.Client{Timeout: 60 * time.Second}
	pad := strings.Repeat("x", 16<<10) // the intake log fills in a few hundred requests
	var (
		mu       sync.Mutex
		got      = map[string][]sent{} // by stamp
		refused  int                   // answers not 2xx
		diskFull int                   // of them, those saying the disk is full
		taken    int                   // 200s
		halt     = make(chan struct{})
		senders  sync.WaitGroup
	)
	for g := range 4 {
		senders.Go(func() {
			for n := 0; ; n++ {
				body := fmt.Sprintf(`{"id":"f%d-%d","pad":"%s"}`, g, n, pad)
				for {
					select {
					case <-halt:
						return
					default:
					}
					s := send(client, rig.url, body)
					mu.Lock()
					got[body] = append(got[body], s)
					if s.status/100 != 2 {
						refused++
					}
					if strings.Contains(s.answer, "disk full") {
						diskFull++
					}
					if s.status == http.StatusOK {
						taken++
					}
					mu.Unlock()
					if s.status/100 == 2 {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	counts := func() (int, int) { mu.Lock(); defer mu.Unlock(); return refused, taken }
	polltest.Until(t, 60*time.Second, func() bool { _, ok := counts(); return ok >= 50 }, "traffic did not flow")
	free := disktest.Fill(t, rig.agentDir, 0)
	polltest.Until(t, 120*time.Second, func() bool { full, _ := counts(); return full >= 200 }, "the senders were not refused once the disk was full")
	stop(t, agent, syscall.SIGTERM)
	first := agent.out.String()
	free()
	_, before := counts()
	agent = rig.startAgent(t, hs.URL)
	polltest.Until(t, 60*time.Second, func() bool { _, ok := counts(); return ok >= before+50 }, "requests were not taken again once there was room")
	close(halt)
	senders.Wait()
	stop(t, agent, syscall.SIGTERM)

	seen := h.order()
	most := 0
	for _, at := range seen {
		most = max(most, len(at))
	}
	t.Logf("%d refusals for a full disk; at most %d copies of a request at the handler; answers kept in the reserve at the stop: %v",
		diskFull, most, strings.Contains(first, "kept in the answer reserve"))
	if diskFull == 0 {
		t.Error(`no refusal said "disk full"`)
	}
	for body, ss := range got {
		if n := len(seen[body]); n > 2 {
			t.Errorf("%.12s… reached the handler %d times", body, n)
		}
		for _, s := range ss {
			if s.status == http.StatusBadGateway || strings.Contains(s.answer, "could not be reached") {
				t.Errorf("%.12s…: %d %s", body, s.status, s.answer)
			}
			if strings.Contains(s.answer, "disk full") && (s.status != http.StatusServiceUnavailable || s.retryAfter == "") {
				t.Errorf("%.12s…: refused %d, Retry-After %q: %s", body, s.status, s.retryAfter, s.answer)
			}
		}
	}
	checkAnswers(t, flatten(got))
	_, all := storedBodies(t, rig.agentDir)
	for _, c := range all {
		if c.Status != agentdb.StatusDelivered || c.ResponseStatus != http.StatusOK {
			t.Errorf("%.12s…: %s, response %d, %q; its sender got %v", c.Body, c.Status, c.ResponseStatus, c.Error, statuses(got[string(c.Body)]))
		}
	}
	if t.Failed() {
		t.Logf("the agent on the full disk:\n%s", first)
	}
}

func flatten(got map[string][]sent) []sent {
	var out []sent
	for _, ss := range got {
		out = append(out, ss...)
	}
	return out
}

func statuses(ss []sent) []int {
	out := make([]int, len(ss))
	for i, s := range ss {
		out[i] = s.status
	}
	return out
}
