// Which node holds each tunnel's agent: bucket calltap_tunnels, mirrored on
// every node. An entry changes only by compare-and-swap, and only from the
// node that holds the tunnel (to release it) or the node an agent has just
// reached (to take it over): a node that merely fails to reach the holder
// never writes, so a brief miss cannot send a live agent away.

package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// holders is the mirror of calltap_tunnels and this node's own holds.
type holders struct {
	*link
	kv   jetstream.KeyValue
	node string

	mu        sync.Mutex
	entries   map[string]holder // guarded by mu; mirror of calltap_tunnels
	mine      map[string]uint64 // guarded by mu; tunnels held here → revision of the hold
	takenOver func(string)      // guarded by mu; set by Serve
	kicked    func(string)      // guarded by mu; set by Serve: wakes a held tunnel's drain
}

type holder struct {
	relay.Holding
	rev uint64
}

func newHolders(l *link, kv jetstream.KeyValue, node string) *holders {
	return &holders{link: l, kv: kv, node: node, entries: map[string]holder{}, mine: map[string]uint64{}}
}

// apply brings an entry of the bucket into the mirror, and tells Serve's
// handler when another node has taken over a tunnel held here.
func (h *holders) apply(e jetstream.KeyValueEntry) {
	id := e.Key()
	var hd relay.Holding
	if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &hd) != nil {
		h.log.Warn("unreadable tunnel record in NATS", "key", id)
		return
	}
	h.mu.Lock()
	if cur, ok := h.entries[id]; ok && cur.rev > e.Revision() {
		h.mu.Unlock()
		return // Hold stored a newer one already
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(h.entries, id)
	} else {
		h.entries[id] = holder{hd, e.Revision()}
	}
	// Only another node naming itself is a takeover: an entry emptied or
	// deleted behind this node's back (by an older calltap, or by hand)
	// says nothing about the agent connected here.
	rev, held := h.mine[id]
	lost := held && e.Revision() > rev && e.Operation() == jetstream.KeyValuePut && hd.Node != "" && hd.Node != h.node
	if lost {
		delete(h.mine, id)
	}
	takenOver := h.takenOver
	h.mu.Unlock()
	if lost && takenOver != nil {
		takenOver(id)
	}
}

// holderNow reads which node holds tunnelID's agent from the leader of
// the bucket's stream: the mirror, and a KeyValue Get, may not have heard
// of a hold stored a moment ago.
func (h *holders) holderNow(ctx context.Context, tunnelID string) (string, error) {
	v, _, err := h.lastEntry(ctx, bucketTunnels, tunnelID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	var hd relay.Holding
	if json.Unmarshal(v, &hd) != nil {
		return "", nil // unreadable: nobody named
	}
	return hd.Node, nil
}

// Holder says which node holds tunnelID's agent.
func (h *holders) Holder(tunnelID string) relay.Holding {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.entries[tunnelID].Holding
}

// Hold records that this node holds tunnelID's agent: a compare-and-swap
// over the entry as it is now, read again if another node moved it
// meanwhile. The release it returns empties the entry only if it is still
// this hold. An entry naming an agent run started after inst stays:
// relay.ErrHeldByNewer.
func (h *holders) Hold(ctx context.Context, tunnelID string, require []wire.HeaderField, inst wire.Instance) (func(), error) {
	hd := relay.Holding{Node: h.node, Require: require, Instance: inst}
	b, _ := json.Marshal(hd)
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	defer h.stalled("record that this node holds a tunnel", "tunnel", tunnelID)()
	var rev uint64
	for {
		e, err := h.kv.Get(ctx, tunnelID)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			rev, err = h.kv.Create(ctx, tunnelID, b)
		case err == nil && heldByNewer(e.Value(), inst):
			return nil, relay.ErrHeldByNewer
		case err == nil:
			rev, err = h.kv.Update(ctx, tunnelID, b, e.Revision())
		}
		if casMissed(err) {
			continue // another node wrote between the read and the swap
		}
		if err != nil {
			return nil, err
		}
		break
	}
	h.mu.Lock()
	h.mine[tunnelID] = rev
	if h.entries[tunnelID].rev < rev {
		h.entries[tunnelID] = holder{hd, rev}
	}
	h.mu.Unlock()
	return func() { h.release(tunnelID, require, rev) }, nil
}

// casMissed reports a compare-and-swap that lost to another write. A
// replicated bucket says so with its own code (ErrKeyRevisionMismatch),
// which ErrKeyExists does not match.
func casMissed(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// heldByNewer reports whether the entry value names an agent run, on any
// node, started after inst. An entry without one (released, or from an
// older calltap) names none.
func heldByNewer(value []byte, inst wire.Instance) bool {
	var cur relay.Holding
	if len(value) == 0 || json.Unmarshal(value, &cur) != nil || cur.Node == "" {
		return false
	}
	return inst.OlderThan(cur.Instance)
}

// release empties tunnelID's entry if it is still the hold of revision rev:
// the agent may be on another node already.
func (h *holders) release(tunnelID string, require []wire.HeaderField, rev uint64) {
	h.mu.Lock()
	ours := h.mine[tunnelID] == rev
	if ours {
		delete(h.mine, tunnelID)
	}
	h.mu.Unlock()
	if !ours {
		return
	}
	b, _ := json.Marshal(relay.Holding{Require: require})
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	defer cancel()
	if _, err := h.kv.Update(ctx, tunnelID, b, rev); err != nil && !casMissed(err) {
		h.log.Warn("could not record that the agent left", "tunnel", tunnelID, "err", err)
	}
}
