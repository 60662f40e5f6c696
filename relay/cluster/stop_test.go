package cluster_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
)

// A node that stops while other nodes hand it requests for its agent
// never answers for a handler: each sender gets the handler's status and
// bytes, 202 when the request was queued, or a 5xx it retries; and every
// request answered 2xx is saved by the agent exactly once.
func TestNodeStopsWhileForwarding(t *testing.T) {
	nats := natstest.Start(t, 3)
	a := startNode(t, nats, "a", nil)
	b := startNode(t, nats, "b", nil)
	c := startNode(t, nats, "c", nil)
	info := token(t, a, "alice")
	h, ts := startHandler(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		time.Sleep(200 * time.Millisecond) // a handler at work while the node stops
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("handled " + string(body)))
	})
	ra := startAgent(t, t.TempDir(), info.Token, ts.URL, c, a, b)
	waitHeld(t, info, a, b, c)

	const senders = 20
	type result struct {
		body, got, retryAfter string
		status                int
		err                   error
	}
	results := make([]result, senders)
	var wg sync.WaitGroup
	for i := range senders {
		via := a
		if i%2 == 1 {
			via = b
		}
		results[i].body = fmt.Sprintf(`{"n":%d}`, i)
		wg.Go(func() {
			resp, err := http.Post(tunnelURL(via, info), "application/json", strings.NewReader(results[i].body))
			if err != nil {
				results[i].err = err
				return
			}
			defer resp.Body.Close()
			got, _ := io.ReadAll(resp.Body)
			results[i].status, results[i].got, results[i].retryAfter = resp.StatusCode, string(got), resp.Header.Get("Retry-After")
		})
	}
	polltest.Until(t, 10*time.Second, func() bool { return len(h.seen()) > 0 }, "no request reached the handler")
	c.stop()
	wg.Wait()

	var kept []string
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("sender %d: %v", i, r.err)
		case r.status == http.StatusCreated:
			if r.got != "handled "+r.body {
				t.Errorf("sender %d: 201 with %q, want the handler's bytes", i, r.got)
			}
			kept = append(kept, r.body)
		case r.status == http.StatusAccepted:
			kept = append(kept, r.body)
		case r.status >= 500:
			if r.status == http.StatusServiceUnavailable && r.retryAfter == "" {
				t.Errorf("sender %d: 503 without Retry-After: %s", i, r.got)
			}
		default:
			t.Errorf("sender %d: %d %q: a status no handler gave", i, r.status, r.got)
		}
	}
	t.Logf("%d of %d senders answered 2xx", len(kept), senders)
	// What was queued drains once the agent reaches another node.
	polltest.Until(t, 30*time.Second, func() bool {
		saved := map[string]int{}
		for _, cp := range ra.captures(t) {
			saved[string(cp.Body)]++
		}
		for _, body := range kept {
			if saved[body] == 0 {
				return false
			}
		}
		return true
	}, "a request answered 2xx was never saved")
	saved := map[string]int{}
	for _, cp := range ra.captures(t) {
		saved[string(cp.Body)]++
	}
	for _, body := range kept {
		if saved[body] != 1 {
			t.Errorf("%s answered 2xx was saved %d times", body, saved[body])
		}
	}
}
