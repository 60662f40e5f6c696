package cluster_test

import (
	"testing"
	"time"

	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel/twintest"
)

// Two agents on one token started at one instant on two nodes: each time
// exactly one keeps the tunnel, reached through either node, and the
// other exits with one line. The holder record names the run, so a node
// refuses an older one even while the newer is held on the other node.
func TestTwinAgentsOnTwoNodesSettleOnOne(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := startNodes(t, nats, 2, nil)
	info := token(t, nodes[0], "alice")
	for round := range 5 {
		survivor, stop := twintest.Race(t, [2]string{nodes[0].URL, nodes[1].URL}, info.Token, time.Minute)
		for _, n := range nodes {
			polltest.Until(t, 10*time.Second, func() bool {
				resp, body := post(t, tunnelURL(n, info), "{}")
				return resp.StatusCode == twintest.Status && body == survivor
			}, "the agent that stayed does not get the tunnel's requests through "+n.name)
		}
		if err := stop(); err != nil {
			t.Fatalf("round %d: the agent that stayed (%s) ended with %v", round, survivor, err)
		}
	}
}
