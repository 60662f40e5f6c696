// What a relay node needs of the others that share its Store, and the
// errors they answer with. cluster.go is how the Server uses them.

package relay

import (
	"context"
	"errors"
	"time"

	"github.com/calltap/calltap/relay/wire"
)

// Cluster is how a relay node reaches the others that share its Store
// (relay/cluster implements it over NATS). A single node has none.
type Cluster interface {
	// Self names this node among the others.
	Self() string
	// Holder says which node holds tunnelID's agent, from a local
	// mirror: no round trip.
	Holder(tunnelID string) Holding
	// Hold records that this node now holds tunnelID's agent, run inst,
	// which requires require of every sender. release gives the tunnel
	// up, unless another node has taken it meanwhile. ErrHeldByNewer, and
	// nothing recorded, when the record names a run started after inst.
	Hold(ctx context.Context, tunnelID string, require []wire.HeaderField, inst wire.Instance) (release func(), err error)
	// Forward hands req to node and returns its answer; ErrNodeGone when
	// no node by that name is serving and its lease has lapsed (Leased),
	// so that it delivers nothing live any more.
	Forward(ctx context.Context, node, tunnelID string, req *wire.Request) (*wire.Answer, error)
	// Leased reports whether this node may deliver live requests to the
	// agents it holds. A node cut off from the others stops (its lease
	// lapses) before any other node can take it for gone and queue its
	// tunnels' requests: a live request delivered then would overtake
	// them. A node without its lease queues what it takes instead.
	Leased() bool
	// Kick tells the node holding tunnelID, if any, that its queue grew,
	// and returns once that node has counted the queue again: a live
	// request it takes after that waits behind what was queued. It reads
	// the holder from the shared state itself, not from the mirror, which
	// may lag. An error says the holder could not be told in time; it
	// learns of the queue later (its drain looks again).
	Kick(ctx context.Context, tunnelID string) error
	// Serve receives the other nodes' forwards and kicks, and learns of
	// tunnels taken over by other nodes, until ctx ends.
	Serve(ctx context.Context, h NodeHandlers) error
	// Stats are for /metrics.
	Stats(ctx context.Context) (ClusterStats, error)
}

// ClusterStats are a node's view of the cluster.
type ClusterStats struct {
	RTT    time.Duration // a round trip to the NATS server this node uses
	Queued uint64        // requests in the shared queue, every tunnel's: how far agents lag
}

// Holding is where a tunnel's agent is. Node is "" while no agent holds
// it; Require stays what its last agent asked of senders, and Instance
// which run it was (zero for an agent that did not say): a run older than
// it is refused on every node.
type Holding struct {
	Node     string             `json:"node"`
	Require  []wire.HeaderField `json:"require,omitempty"`
	Instance wire.Instance      `json:"instance,omitzero"`
}

// ErrHeldByNewer is Hold's error when an agent run started later than the
// one connecting holds the tunnel.
var ErrHeldByNewer = errors.New("relay: a newer agent holds the tunnel")

// NodeHandlers are a Server's answers to the other nodes.
type NodeHandlers struct {
	// Forward answers a request another node took. It delivers or queues
	// req only before takeBy, on this node's monotonic clock: after it,
	// the other node may have answered its sender already, and a sender
	// answered anything but 2xx must reach the handler only through its
	// own retry. A zero takeBy sets no limit (a node of an older calltap
	// sends none).
	Forward   func(ctx context.Context, tunnelID string, req *wire.Request, takeBy time.Time) *wire.Answer
	Kicked    func(tunnelID string)
	TakenOver func(tunnelID string) // another node holds a tunnel this one holds
	Revoked   func(tunnelID string) // its token was revoked, on any node
	// Regained is called when this node's lease is back after a lapse,
	// before Leased says so: other nodes may have queued requests for its
	// tunnels meanwhile, and told it in kicks it did not hear.
	Regained func()
}

// ErrQueueFull is a Store's answer to Enqueue when the tunnel's queue
// holds as many requests as it may (in a cluster the stream counts them,
// exactly, across nodes).
var ErrQueueFull = errors.New("the tunnel's queue is full")

// ErrMaybeStored is a Store's answer to Enqueue when it could not confirm
// the request was stored, and it may be all the same (an ack lost, or a
// publish a frozen server stores when it wakes). The request may yet be
// delivered: its sender is told the outcome is unknown.
var ErrMaybeStored = errors.New("relay: the store did not confirm the request, which may be kept all the same")

// ErrNodeGone is Cluster.Forward's error when the holding node is not
// serving: it died, or is restarting.
var ErrNodeGone = errors.New("relay: the node holding the agent is gone")

// ErrAnswerLost is Cluster.Forward's error when the holding node took
// the request and its answer did not come through: it fell silent, or its
// answer could not be read. The request may have reached the handler.
// (Silence before it took the request is another error: that request
// reaches the handler never.)
var ErrAnswerLost = errors.New("relay: the node holding the agent took the request, but its answer was lost")
