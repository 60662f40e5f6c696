// The Cluster of a relay that is the only node, so that the relay's code
// has one path for both: every tunnel it serves is held here or nowhere,
// no request is handed to another node, and nobody else drains its queue.

package relay

import (
	"context"
	"errors"
	"sync"
)

// soloNode is Config.Cluster when none is given.
type soloNode struct {
	mu      sync.Mutex
	require map[string][]HeaderField // guarded by mu; what each tunnel's last agent asked of senders
}

var errSolo = errors.New("relay: a single node has no other node")

func newSoloNode() *soloNode { return &soloNode{require: map[string][]HeaderField{}} }

// Self is "", the node every Holding names when no other node holds it.
func (*soloNode) Self() string { return "" }

func (n *soloNode) Holder(tunnelID string) Holding {
	n.mu.Lock()
	defer n.mu.Unlock()
	return Holding{Require: n.require[tunnelID]}
}

// Hold remembers what the agent requires; release keeps it, as a cluster's
// holder entry does, for senders arriving while the agent is away.
func (n *soloNode) Hold(_ context.Context, tunnelID string, require []HeaderField) (func(), error) {
	n.mu.Lock()
	n.require[tunnelID] = require
	n.mu.Unlock()
	return func() {}, nil
}

// Forward is never called: no tunnel is held elsewhere.
func (*soloNode) Forward(context.Context, string, string, *Request) (*Answer, error) {
	return nil, errSolo
}

// Kick does nothing: the enqueuing node is the one that drains.
func (*soloNode) Kick(string) {}

// Serve waits for ctx: no other node sends anything.
func (*soloNode) Serve(ctx context.Context, _ NodeHandlers) error {
	<-ctx.Done()
	return nil
}

// Stats has nothing to report: /metrics shows no cluster.
func (*soloNode) Stats(context.Context) (ClusterStats, error) { return ClusterStats{}, errSolo }
