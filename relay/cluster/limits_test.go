package cluster_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
)

// The queue's limit is the stream's: three rounds of (agent away, 60
// requests to a node that does not hold it, agent back, queue drained)
// with a limit of 100 are all queued, every round; and every node's
// estimate falls back to 0 once the stream is drained.
func TestQueueLimitIsTheStreams(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := startNodes(t, nats, 3, func(c *relay.Config) { c.QueueMaxCount = 100 })
	a, b := nodes[0], nodes[1]
	info := token(t, a, "alice")
	h, ts := startHandler(t, nil)
	dir := t.TempDir()
	delivered := 0
	for round := 1; round <= 3; round++ {
		for i := range 60 {
			resp, body := post(t, tunnelURL(b, info), fmt.Sprintf(`{"round":%d,"n":%d}`, round, i))
			// NATS too slow to store it on a loaded machine: the sender
			// retries, as the service does (queue_full is not retried).
			for try := 1; resp.StatusCode == http.StatusServiceUnavailable && errorCode(t, body) == "unavailable" && try < 3; try++ {
				resp, body = post(t, tunnelURL(b, info), fmt.Sprintf(`{"round":%d,"n":%d}`, round, i))
			}
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("round %d, request %d: %d %s, want 202", round, i, resp.StatusCode, body)
			}
		}
		ra := startAgent(t, dir, info.Token, ts.URL, a)
		delivered += 60
		polltest.Until(t, 30*time.Second, func() bool { return len(h.seen()) >= delivered }, fmt.Sprintf("round %d did not drain", round))
		polltest.Until(t, 10*time.Second, func() bool {
			st, err := a.c.TunnelQueueStats(context.Background(), info.TunnelID)
			return err == nil && st.Count == 0
		}, "the stream still holds delivered requests")
		ra.stop()
		polltest.Until(t, 10*time.Second, func() bool { return a.c.Holder(info.TunnelID).Node == "" }, "the agent's node did not release the tunnel")
	}
	for _, n := range nodes {
		polltest.Until(t, 10*time.Second, func() bool {
			m := metrics(t, n)
			return strings.Contains(m, "\ncalltap_queue_depth 0\n") && strings.Contains(m, "\ncalltap_cluster_queue_depth 0\n")
		}, "the queue depth of "+n.name+" did not fall to 0")
	}
}
