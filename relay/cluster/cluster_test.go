package cluster_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage/relaystate"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errorCode is the code of an error envelope.
func errorCode(t *testing.T, body string) string {
	t.Helper()
	var env struct {
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &env); err != nil || env.Error == nil {
		t.Fatalf("not an error envelope: %q", body)
	}
	return env.Error.Code
}

// A webhook that lands on a node other than the agent's gets the
// handler's answer byte-exact, with one node's statuses, bodies beyond
// NATS's 1 MiB included.
func TestCrossNodeLiveDelivery(t *testing.T) {
	nats := natstest.Start(t, 3)
	// Generous: 3 MiB crosses two nodes and NATS in chunks, which takes
	// tens of seconds under the race detector on a loaded machine.
	nodes := startNodes(t, nats, 3, func(c *relay.Config) { c.ForwardTimeout = 90 * time.Second })
	info := token(t, nodes[1], "alice")
	_, ts := startHandler(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		switch r.URL.Path {
		case "/teapot":
			w.WriteHeader(http.StatusTeapot)
		default:
			w.Header().Add("X-Reply", "one")
			w.Header().Add("X-Reply", "two")
			w.WriteHeader(http.StatusCreated)
			w.Write(bytes.ToUpper(body))
		}
	})
	ra := startAgent(t, t.TempDir(), info.Token, ts.URL, nodes[0])
	waitHeld(t, info, nodes...)

	for _, n := range nodes {
		resp, body := post(t, tunnelURL(n, info)+"/hook?x=1", `{"event":"call.started"}`)
		if resp.StatusCode != http.StatusCreated || body != `{"EVENT":"CALL.STARTED"}` {
			t.Fatalf("via %s: %d %q", n.name, resp.StatusCode, body)
		}
		if got := resp.Header.Values("X-Reply"); len(got) != 2 || got[0] != "one" || got[1] != "two" {
			t.Errorf("via %s: X-Reply %q", n.name, got)
		}
	}
	if resp, _ := post(t, tunnelURL(nodes[2], info)+"/teapot", "{}"); resp.StatusCode != http.StatusTeapot {
		t.Errorf("the handler's status is passed through: got %d", resp.StatusCode)
	}

	// 3 MiB each way: more than one NATS message holds.
	big := make([]byte, 3<<20)
	rand.Read(big)
	// A 503 with Retry-After (NATS too slow to hand the chunks over, on a
	// loaded machine) is retried, as the service does.
	var r *http.Response
	var got []byte
	for try := 1; ; try++ {
		var err error
		r, err = http.Post(tunnelURL(nodes[1], info)+"/big", "application/octet-stream", bytes.NewReader(big))
		if err != nil {
			t.Fatal(err)
		}
		got, _ = io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" || try == 3 {
			break
		}
		t.Logf("3 MiB body, try %d: %d %s; retrying", try, r.StatusCode, got)
	}
	if r.StatusCode != http.StatusCreated || !bytes.Equal(got, bytes.ToUpper(big)) {
		t.Fatalf("3 MiB body: status %d, %d bytes back, equal %v (%.300s)", r.StatusCode, len(got), bytes.Equal(got, bytes.ToUpper(big)), got)
	}
	cs := ra.captures(t)
	if last := cs[len(cs)-1]; !bytes.Equal(last.Body, big) {
		t.Errorf("the agent saved %d bytes of the 3 MiB body, or other bytes", len(last.Body))
	}

	ts.Close() // the handler is gone: 502, from another node too
	resp, body := post(t, tunnelURL(nodes[2], info)+"/hook", "{}")
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "bad_gateway" {
		t.Errorf("an unreachable handler: %d %s", resp.StatusCode, body)
	}

	m := metrics(t, nodes[0])
	if !strings.Contains(m, `calltap_cluster_requests_total{direction="in"}`) || strings.Contains(m, `calltap_cluster_requests_total{direction="in"} 0`) {
		t.Errorf("node 0 counts no request in from other nodes:\n%s", m)
	}
	for _, want := range []string{"calltap_tunnels_connected 1", "calltap_nats_up 1", "calltap_nats_rtt_seconds", "calltap_cluster_queue_depth 0"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics of node 0 lack %q", want)
		}
	}
	if m := metrics(t, nodes[2]); strings.Contains(m, `calltap_cluster_requests_total{direction="out"} 0`) {
		t.Errorf("node 2 counts no request out:\n%s", m)
	}
}

// A handler slower than the forward timeout, reached through another
// node: that node answers 504 gateway_timeout, as one node does.
func TestCrossNodeSlowHandler(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := startNodes(t, nats, 2, func(c *relay.Config) { c.ForwardTimeout = 2 * time.Second })
	slowDone := make(chan struct{})
	var releaseSlow sync.Once
	defer releaseSlow.Do(func() { close(slowDone) })
	info := token(t, nodes[0], "alice")
	_, ts := startHandler(t, func(w http.ResponseWriter, r *http.Request, body []byte) { <-slowDone })
	startAgent(t, t.TempDir(), info.Token, ts.URL, nodes[0])
	waitHeld(t, info, nodes...)
	resp, body := post(t, tunnelURL(nodes[1], info)+"/slow", "{}")
	if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, body) != "gateway_timeout" {
		t.Errorf("a slow handler: %d %s", resp.StatusCode, body)
	}
}

func metrics(t *testing.T, n *node) string {
	t.Helper()
	resp, err := http.Get(n.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// With the agent away, webhooks landing on all three nodes are queued in
// the stream, then delivered exactly once, in order, through whichever
// node the agent reaches, and removed once it saved them.
func TestQueueAcrossNodes(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := startNodes(t, nats, 3, nil)
	info := token(t, nodes[0], "alice")
	h, ts := startHandler(t, nil)

	const n = 30
	var want []string
	for i := range n {
		body := fmt.Sprintf(`{"n":%d}`, i)
		want = append(want, body)
		resp, b := post(t, tunnelURL(nodes[i%3], info), body)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d via %s: %d %s", i, nodes[i%3].name, resp.StatusCode, b)
		}
	}
	if st, err := nodes[1].c.TunnelQueueStats(context.Background(), info.TunnelID); err != nil || st.Count != n {
		t.Fatalf("queued in the stream: %+v %v, want %d", st, err, n)
	}
	ra := startAgent(t, t.TempDir(), info.Token, ts.URL, nodes[2])
	polltest.Until(t, 15*time.Second, func() bool { return len(h.seen()) >= n }, "the queue did not drain")
	// A request after the drain goes behind the queued ones: live (204),
	// or queued (202) if the holding node has not yet read the agent's
	// last acks.
	if resp, _ := post(t, tunnelURL(nodes[0], info), `{"n":"live"}`); resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusAccepted {
		t.Errorf("a request after the drain: %d", resp.StatusCode)
	}
	want = append(want, `{"n":"live"}`)
	polltest.Until(t, 10*time.Second, func() bool { return len(h.seen()) > n }, "the request after the drain did not arrive")
	if got := h.seen(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the handler saw\n%v\nwant\n%v", got, want)
	}
	polltest.Until(t, 10*time.Second, func() bool {
		st, err := nodes[0].c.TunnelQueueStats(context.Background(), info.TunnelID)
		return err == nil && st.Count == 0
	}, "the stream still holds delivered requests")
	if cs := ra.captures(t); len(cs) != n+1 {
		t.Errorf("the agent saved %d captures, want %d", len(cs), n+1)
	}
}

// Revoking a token on any node drops its agent wherever it is within a
// second, and its URL answers 404 on every node.
func TestRevokeOnAnyNode(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := startNodes(t, nats, 3, nil)
	info := token(t, nodes[0], "alice")
	_, ts := startHandler(t, nil)
	ra := startAgent(t, t.TempDir(), info.Token, ts.URL, nodes[1])
	waitHeld(t, info, nodes...)
	for _, n := range nodes { // every node has looked the tunnel up
		if resp, _ := post(t, tunnelURL(n, info), "{}"); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("before revoking, via %s: %d", n.name, resp.StatusCode)
		}
	}
	start := time.Now()
	if err := nodes[2].c.RevokeToken(context.Background(), "alice"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ra.clientErr:
		if !errors.Is(err, tunnel.ErrRevoked) {
			t.Errorf("the client ended with %v, want ErrRevoked", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("the agent was dropped %s after the revoke, want within 1 s", d)
		}
	case <-time.After(time.Second):
		t.Fatal("the agent was not dropped within 1 s of the revoke on another node")
	}
	for _, n := range nodes {
		polltest.Until(t, time.Second, func() bool {
			resp, _ := post(t, tunnelURL(n, info), "{}")
			return resp.StatusCode == http.StatusNotFound
		}, "the URL of a revoked token does not answer 404 on "+n.name)
	}
}

// One NATS server of three dies: the relays keep serving and lose nothing
// acknowledged. All of them die: 503 with Retry-After, never 202; back,
// the relays recover.
func TestNATSServersDie(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := startNodes(t, nats, 3, nil)
	info := token(t, nodes[0], "alice")
	h, ts := startHandler(t, nil)

	nats.Stop(0)
	var want []string
	for i := range 9 {
		body := fmt.Sprintf(`{"n":%d}`, i)
		resp, b := post(t, tunnelURL(nodes[i%3], info), body)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("with one NATS server down, request %d: %d %s", i, resp.StatusCode, b)
		}
		want = append(want, body)
	}
	agentDir := t.TempDir()
	ra := startAgent(t, agentDir, info.Token, ts.URL, nodes[1])
	polltest.Until(t, 15*time.Second, func() bool { return len(h.seen()) == len(want) }, "the queue did not drain with one NATS server down")
	resp, _ := post(t, tunnelURL(nodes[2], info), `{"n":"live"}`)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusAccepted { // 202: behind the last acks
		t.Errorf("across nodes with one NATS server down: %d", resp.StatusCode)
	}
	want = append(want, `{"n":"live"}`)
	polltest.Until(t, 10*time.Second, func() bool { return len(h.seen()) == len(want) }, "the request after the drain did not arrive")
	// The holding node has seen the queue empty: nothing can be ahead of
	// a live request, whatever happens to NATS now.
	polltest.Until(t, 10*time.Second, func() bool {
		m := metrics(t, nodes[1])
		return strings.Contains(m, "\ncalltap_queue_depth 0\n") && strings.Contains(m, "\ncalltap_cluster_queue_depth 0\n")
	}, "the holding node did not see its queue empty")

	nats.Stop(1)
	nats.Stop(2)
	// Every NATS server gone: the others cannot reach the node holding the
	// agent, nor store, and say so. (A request handed to n1 just as NATS
	// went waits out its timeout: 504.)
	polltest.Until(t, 30*time.Second, func() bool {
		resp, body := post(t, tunnelURL(nodes[0], info), `{"n":"lost?"}`)
		if resp.StatusCode == http.StatusAccepted {
			t.Fatalf("n0 answered 202 with every NATS server down: %s", body)
		}
		return resp.StatusCode == http.StatusServiceUnavailable
	}, "n0 did not notice NATS was gone")
	// The node holding the agent cannot tell this from being cut off
	// alone, while the others queue: once its lease lapses it delivers
	// nothing live (a live request would overtake theirs), and cannot
	// queue either: 503 with Retry-After, as the others.
	unanswered := map[string]bool{`{"n":"lost?"}`: true}
	tries := 0
	polltest.Until(t, 30*time.Second, func() bool {
		tries++ // each try a body of its own: the handler's copies are told apart by it
		local := fmt.Sprintf(`{"n":"local","try":%d}`, tries)
		resp, body := post(t, tunnelURL(nodes[1], info), local)
		switch resp.StatusCode {
		case http.StatusNoContent: // within the lease
			want = append(want, local)
			return false
		case http.StatusServiceUnavailable:
			unanswered[local] = true
			return resp.Header.Get("Retry-After") != ""
		}
		t.Fatalf("the node holding the agent, NATS gone: %d %s, want the handler's 204, then 503", resp.StatusCode, body)
		return false
	}, "the node holding the agent went on delivering live with NATS gone")
	ra.stop()
	for _, n := range nodes {
		polltest.Until(t, 10*time.Second, func() bool {
			resp, body := post(t, tunnelURL(n, info), `{"n":"lost?"}`)
			if resp.StatusCode == http.StatusAccepted {
				t.Fatalf("%s answered 202 with every NATS server down: %s", n.name, body)
			}
			return resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != ""
		}, "no 503 with Retry-After from "+n.name+" with every NATS server down")
	}

	for i := range 3 {
		nats.Restart(i)
	}
	nats.WaitReady()
	// A try answered other than 202 told its sender to retry; like
	// "lost?", it may be kept all the same, so each try is told apart.
	var back string
	polltest.Until(t, 30*time.Second, func() bool {
		back = fmt.Sprintf(`{"n":"back","try":%d}`, len(unanswered))
		resp, _ := post(t, tunnelURL(nodes[0], info), back)
		unanswered[back] = resp.StatusCode != http.StatusAccepted
		return resp.StatusCode == http.StatusAccepted
	}, "the relays did not recover once NATS was back")
	want = append(want, back)
	// The same agent (its store) comes back, on another node. A queued
	// request whose removal from the stream NATS's death cut short (it
	// may be "live", answered 202 behind the last acks) is sent to it
	// again; it knows it by its relay id and does not deliver it twice.
	startAgent(t, agentDir, info.Token, ts.URL, nodes[2])
	polltest.Until(t, 15*time.Second, func() bool { return len(h.seen()) >= len(want) }, "what was queued once NATS came back was not delivered")
	// A "lost?" answered 504 may have reached the handler, as with one
	// node: its sender was told to retry, not that it was kept.
	got := slices.DeleteFunc(h.seen(), func(b string) bool { return unanswered[b] })
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the handler saw\n%v\nwant\n%v", got, want)
	}
}

// The queue's count limit holds across nodes: the stream counts, so three
// nodes together keep no more than --queue-max-count, and the next request
// on any node is refused 503 queue_full, never 202.
func TestQueueLimitAcrossNodes(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := startNodes(t, nats, 3, func(c *relay.Config) { c.QueueMaxCount = 4 })
	info := token(t, nodes[0], "alice")
	for i := range 4 {
		if resp, b := post(t, tunnelURL(nodes[i%3], info), fmt.Sprintf(`{"n":%d}`, i)); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	for _, n := range nodes {
		resp, body := post(t, tunnelURL(n, info), `{"n":"over"}`)
		if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "queue_full" || resp.Header.Get("Retry-After") == "" {
			t.Errorf("a fifth request via %s: %d %s (Retry-After %q), want 503 queue_full", n.name, resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
	}
	// The stream refuses it itself, whatever a node counted.
	err := nodes[2].c.Enqueue(context.Background(), &relaystate.QueuedRequest{ID: "over", TunnelID: info.TunnelID, Method: "POST", URI: "/"})
	if !errors.Is(err, relay.ErrQueueFull) {
		t.Errorf("a fifth request stored straight into the stream: %v, want ErrQueueFull", err)
	}

	// A token command, with its defaults (one replica, the default limit),
	// changes neither the nodes' limit nor their replicas.
	tool, err := cluster.Open(context.Background(), cluster.Options{URLs: nats.URLs(), Tool: true, Logger: testLogger(t, "token command")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.CreateToken(context.Background(), tool, "bob", nodes[0].URL); err != nil {
		t.Fatal(err)
	}
	tool.Close()
	nc, err := natsgo.Connect(nats.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), "CALLTAP_QUEUE")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := st.CachedInfo().Config; cfg.MaxMsgsPerSubject != 4 || cfg.Replicas != 3 {
		t.Errorf("after a token command the queue stream keeps %d per tunnel on %d replicas, want 4 on 3", cfg.MaxMsgsPerSubject, cfg.Replicas)
	}
	kv, err := js.KeyValue(context.Background(), "calltap_tokens")
	if err != nil {
		t.Fatal(err)
	}
	if kst, err := kv.Status(context.Background()); err != nil || kst.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 {
		t.Errorf("after a token command the token bucket has %v replicas (err %v), want 3", kst, err)
	}
}
