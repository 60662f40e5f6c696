package cluster_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// tunnelsBucket opens calltap_tunnels with a client of the test's own.
func tunnelsBucket(t *testing.T, nats *natstest.Cluster) jetstream.KeyValue {
	return testBucket(t, nats, "calltap_tunnels")
}

// testBucket opens a bucket with a client of the test's own.
func testBucket(t *testing.T, nats *natstest.Cluster, name string) jetstream.KeyValue {
	t.Helper()
	kv, err := testJetStream(t, nats).KeyValue(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// testJetStream is a JetStream client of the test's own, closed at its end.
func testJetStream(t *testing.T, nats *natstest.Cluster) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(nats.URLs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	return js
}

func holderIn(t *testing.T, kv jetstream.KeyValue, tunnelID string) string {
	t.Helper()
	e, err := kv.Get(context.Background(), tunnelID)
	if err != nil {
		t.Fatal(err)
	}
	var h relay.Holding
	json.Unmarshal(e.Value(), &h)
	return h.Node
}

// A node that once finds nobody serving the holder's subject (no
// responders: a restart, a blip) queues the request and leaves the holder
// entry alone: only the holder, or a node taking over, changes it.
func TestMissDoesNotEvictHolder(t *testing.T) {
	nats := natstest.Start(t, 3)
	b := startNode(t, nats, "b", nil)
	info := token(t, b, "alice")
	// Node x holds the tunnel but serves no forwards at this moment.
	x, err := cluster.Open(context.Background(), cluster.Options{URLs: nats.URLs(), Node: "x", Logger: testLogger(t, "node x")})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if _, err := x.Hold(context.Background(), info.TunnelID, nil, wire.Instance{}); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, info, b)
	resp, body := post(t, tunnelURL(b, info), `{"n":1}`)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("a request whose holder does not answer: %d %s, want 202 (queued)", resp.StatusCode, body)
	}
	if got := holderIn(t, tunnelsBucket(t, nats), info.TunnelID); got != "x" {
		t.Errorf("after one miss the holder entry names %q, want x", got)
	}
}

// An agent told it was replaced when no other agent took its tunnel (a
// holder entry written behind the holder's back) reconnects instead of
// exiting, and gets its tunnel back.
func TestMistakenReplaceReconnects(t *testing.T) {
	nats := natstest.Start(t, 3)
	a := startNode(t, nats, "a", nil)
	info := token(t, a, "alice")
	_, ts := startHandler(t, nil)
	ra := startAgent(t, t.TempDir(), info.Token, ts.URL, a)
	waitHeld(t, info, a)
	kv := tunnelsBucket(t, nats)
	b, _ := json.Marshal(relay.Holding{Node: "ghost"})
	if _, err := kv.Put(context.Background(), info.TunnelID, b); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, 15*time.Second, func() bool { return a.c.Holder(info.TunnelID).Node == "a" }, "the agent did not take its tunnel back")
	select {
	case err := <-ra.clientErr:
		t.Fatalf("the agent exited: %v", err)
	default:
	}
	polltest.Until(t, 10*time.Second, func() bool {
		resp, _ := post(t, tunnelURL(a, info), "{}")
		return resp.StatusCode == http.StatusNoContent
	}, "the agent does not serve its tunnel again")
}

// Replicas the NATS servers cannot keep are refused at once, with what to
// do about it; a cluster whose servers are still joining is waited for
// (every other test here starts its nodes with a cluster just started).
func TestTooManyReplicasRefused(t *testing.T) {
	nats := natstest.Start(t, 3)
	_, err := cluster.Open(context.Background(), cluster.Options{URLs: nats.URLs(), Node: "x", Replicas: 5, Logger: testLogger(t, "node x")})
	if err == nil || !strings.Contains(err.Error(), "--nats-replicas 1") {
		t.Fatalf("5 replicas on three NATS servers: %v, want the refusal saying --nats-replicas 1", err)
	}
}
