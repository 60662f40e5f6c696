package cluster_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
)

// A node that has not heard that the agent reached another node (nothing
// reaches it from NATS for a moment, by toxiproxy, and what it sends takes
// 500 ms) queues a request (202); a request sent to the holder after that
// 202 must reach the handler after the queued one. Before the queueing
// node told the holder, and waited for it, before it answered, it
// published a kick and answered at once: the holder delivered the second
// request live before the kick reached it, and the queued one came after
// (chaos run, team seed 3301: 4 order violations).
func TestQueuedByAStaleNodeIsNotOvertaken(t *testing.T) {
	nats := natstest.StartUnadvertised(t, 3)
	urls := strings.Split(nats.URLs(), ",")
	holder, _ := startNodeOver(t, "holder", urls[1])
	stale, link := startNodeBehindProxy(t, "stale", urls[0])
	info := token(t, holder, "alice")
	h, ts := startHandler(t, nil)
	first := startAgentAt(t, t.TempDir(), info.Token, ts.URL, holder.URL, nil)
	waitHeld(t, info, holder, stale)
	// The agent leaves, and both nodes hear that nobody holds the tunnel.
	first.stop()
	polltest.Until(t, 10*time.Second, func() bool {
		return holder.c.Holder(info.TunnelID).Node == "" && stale.c.Holder(info.TunnelID).Node == ""
	}, "the nodes did not hear that the agent left")
	// From now on the stale node hears nothing (what NATS sends it is
	// held until the toxic goes, a second or two: NATS's pings go
	// unanswered for 3 s before the client gives the server up), and what
	// it sends takes 500 ms.
	for _, toxic := range []string{
		`{"name":"deaf","type":"latency","stream":"downstream","attributes":{"latency":60000}}`,
		`{"name":"slow","type":"latency","stream":"upstream","attributes":{"latency":500}}`,
	} {
		if _, err := link.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			t.Fatal(err)
		}
	}
	// The agent is back, on the holder; the stale node has not heard.
	startAgentAt(t, t.TempDir(), info.Token, ts.URL, holder.URL, nil)
	type answer struct {
		status int
		body   string
	}
	r1 := make(chan answer, 1)
	go func() {
		resp, err := http.Post(tunnelURL(stale, info), "application/json", strings.NewReader("R1"))
		if err != nil {
			r1 <- answer{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		r1 <- answer{resp.StatusCode, string(b)}
	}()
	// R1 is stored; the stale node hears the ack (and the hold) as soon as
	// it hears again.
	polltest.Until(t, 10*time.Second, func() bool {
		st, err := holder.c.TunnelQueueStats(context.Background(), info.TunnelID)
		return err == nil && st.Count > 0
	}, "R1 was not queued")
	if err := link.Toxics.RemoveToxic(context.Background(), "deaf"); err != nil {
		t.Fatal(err)
	}
	if a := <-r1; a.status != http.StatusAccepted {
		t.Fatalf("the stale node answered R1 %d %s, want 202 (queued)", a.status, a.body)
	}
	if resp, body := post(t, tunnelURL(holder, info), "R2"); resp.StatusCode/100 != 2 {
		t.Fatalf("the holder answered R2 %d %s, want 2xx", resp.StatusCode, body)
	}
	polltest.Until(t, 30*time.Second, func() bool { return len(h.seen()) >= 2 }, "R1 and R2 did not both reach the handler")
	if got := h.seen(); got[0] != "R1" || got[1] != "R2" {
		t.Fatalf("the handler got %q, want R1 (answered 202 before R2 was sent) first", got)
	}
}
