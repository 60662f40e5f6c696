// The Cluster of a relay that is the only node, so that the relay's code
// has one path for both: every tunnel it serves is held here or nowhere,
// no request is handed to another node, and nobody else drains its queue.

package relay

import (
	"context"
	"errors"

	"github.com/calltap/calltap/relay/wire"
)

// soloNode is Config.Cluster when none is given.
type soloNode struct{}

var errSolo = errors.New("relay: a single node has no other node")

// Self is "", the node every Holding names when no other node holds it.
func (soloNode) Self() string { return "" }

// Holder names no other node; what senders must present is the tunnel's
// own (requiredHeaders).
func (soloNode) Holder(string) Holding { return Holding{} }

// Hold has no other node to tell.
func (soloNode) Hold(context.Context, string, []wire.HeaderField, wire.Instance) (func(), error) {
	return func() {}, nil
}

// Forward is never called: no tunnel is held elsewhere.
func (soloNode) Forward(context.Context, string, string, *wire.Request) (*wire.Answer, error) {
	return nil, errSolo
}

// Leased is always true: no other node queues for a tunnel held here.
func (soloNode) Leased() bool { return true }

// Kick does nothing: the enqueuing node is the one that drains.
func (soloNode) Kick(context.Context, string) error { return nil }

// Serve waits for ctx: no other node sends anything.
func (soloNode) Serve(ctx context.Context, _ NodeHandlers) error {
	<-ctx.Done()
	return nil
}

// Stats has nothing to report: /metrics shows no cluster.
func (soloNode) Stats(context.Context) (ClusterStats, error) { return ClusterStats{}, errSolo }
