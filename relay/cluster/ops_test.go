package cluster_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/relaystate"
	"github.com/google/uuid"
)

// A node started while JetStream has no quorum says so once, and once
// that it is ready: not a line per retry.
func TestStartWaitsForJetStreamInTwoLines(t *testing.T) {
	nats := natstest.Start(t, 3)
	nats.Stop(1)
	nats.Stop(2)
	log, lines := captureLog(t, "node")
	opened := make(chan error, 1)
	var c *cluster.Cluster
	go func() {
		var err error
		c, err = cluster.Open(context.Background(), cluster.Options{URLs: nats.URLs(), Replicas: 3, Node: "n0", Logger: log, RequestTimeout: 2 * time.Second})
		opened <- err
	}()
	polltest.Until(t, 60*time.Second, func() bool { return strings.Contains(lines.String(), "JetStream not ready") }, "the node did not say JetStream is not ready")
	nats.Restart(1)
	nats.Restart(2)
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute): // bounds a hang
		t.Fatal("the node did not start once JetStream was back")
	}
	defer c.Close()
	out := lines.String()
	info := strings.Count(out, "level=INFO msg=\"JetStream not ready")
	ready := strings.Count(out, "level=INFO msg=\"JetStream ready\"")
	if info != 1 || ready != 1 {
		t.Errorf("the start logged %d 'not ready' and %d 'ready' lines at INFO, want one each", info, ready)
	}
}

// What an operator reads: the shared queue's depth is the same on every
// node, and stays on /metrics beside calltap_nats_up 0 while NATS is away;
// /metrics and /healthz answer at once whatever NATS does; a request that
// reaches a node whose NATS is gone is answered 503 with Retry-After, and
// the node says so in its log.
func TestOperatingSignals(t *testing.T) {
	nats := natstest.Start(t, 3)
	logs := make([]*capturedLog, 3)
	var nodes []*node
	for i := range 3 {
		l, captured := captureLog(t, fmt.Sprintf("node n%d", i))
		logs[i] = captured
		nodes = append(nodes, startNode(t, nats, fmt.Sprintf("n%d", i), func(c *relay.Config) { c.Logger = l }))
	}
	info := token(t, nodes[0], "alice")
	for i := range 4 {
		if resp, b := post(t, tunnelURL(nodes[i%2], info), fmt.Sprintf(`{"n":%d}`, i)); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d with the agent away: %d %s", i, resp.StatusCode, b)
		}
	}
	for _, n := range nodes {
		polltest.Until(t, 30*time.Second, func() bool { return strings.Contains(metrics(t, n), "\ncalltap_cluster_queue_depth 4\n") },
			"node "+n.name+" does not read the shared queue's depth, 4")
	}

	nats.Shutdown()
	for _, n := range nodes {
		polltest.Until(t, 30*time.Second, func() bool { return strings.Contains(metrics(t, n), "\ncalltap_nats_up 0\n") },
			"node "+n.name+" does not say NATS is down")
		start := time.Now()
		m := metrics(t, n)
		hc := http.Client{Timeout: 30 * time.Second}
		resp, err := hc.Get(n.URL + "/healthz")
		if err != nil {
			t.Fatalf("/healthz of %s while NATS is away: %v", n.name, err)
		}
		resp.Body.Close()
		took := time.Since(start)
		t.Logf("node %s: /metrics and /healthz took %s while NATS is away", n.name, took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Errorf("node %s: /metrics and /healthz took %s while NATS is away, want at once", n.name, took)
		}
		if !strings.Contains(m, "\ncalltap_cluster_queue_depth 4\n") {
			t.Errorf("node %s: while NATS is away the queue's depth is gone or changed:\n%s", n.name, m)
		}
	}

	start := time.Now()
	resp, b := post(t, tunnelURL(nodes[2], info), `{"n":"nats-gone"}`)
	took := time.Since(start)
	t.Logf("a request while NATS is away was answered %d in %s", resp.StatusCode, took.Round(time.Millisecond))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a request while NATS is away: %d (Retry-After %q) %s, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	polltest.Until(t, 30*time.Second, func() bool {
		out := logs[2].String()
		return strings.Contains(out, "msg=enqueue") && strings.Contains(out, "tunnel="+info.TunnelID)
	}, "the node said nothing of the request it could not store")
}

// A request stored in the stream whose kick never reached the node holding
// the agent (a core-NATS message, lost if a connection blinks) is found by
// that node's own look at the stream within seconds, not left waiting for
// the next kick.
func TestLostKickIsFound(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := startNodes(t, nats, 2, nil)
	info := token(t, nodes[0], "alice")
	h, ts := startHandler(t, nil)
	startAgent(t, t.TempDir(), info.Token, ts.URL, nodes[0])
	waitHeld(t, info, nodes...)
	// As node n1 queues a request, without the kick that follows.
	q := &relaystate.QueuedRequest{ID: uuid.NewString(), TunnelID: info.TunnelID, ArrivedAt: time.Now().UnixMicro(),
		Method: http.MethodPost, URI: "/lost-kick", Headers: []byte{0}, Body: []byte(`{"n":"lost-kick"}`)}
	if err := nodes[1].c.Enqueue(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, 60*time.Second, func() bool { return slices.Contains(h.seen(), `{"n":"lost-kick"}`) },
		"a request queued without its kick was never delivered")
}
