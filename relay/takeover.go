// Which agent holds a tunnel: one token serves one agent, and of two agent
// runs on one token the one started later keeps it. Without that order
// two agents sent away by each other would each come back to make sure,
// and leave the tunnel to nobody.

package relay

import (
	"context"
	"errors"

	"github.com/calltap/calltap/relay/wire"
)

// takeTunnel makes ac the agent of t, here and in the cluster, and returns
// the release of its hold, the agent it replaced, and t's queue count; or
// ErrHeldByNewer, and nothing held, when an agent run started later than
// ac's holds t, here or on another node. A run's own reconnect is never
// older than itself: it takes its tunnel back from its stale connection.
//
// Other nodes forward t's requests here from the hold on; what they
// queued before is in the shared queue. It is counted after the hold is
// stored, never before: a node that queued a request reads the holder
// after storing it (enqueue), so either it finds this hold and tells this
// node, whose kicks count from the start (taking), or its request was
// stored before the hold and this count finds it.
func (s *Server) takeTunnel(ctx context.Context, t *tunnel, ac *agentConn, hs *handshake) (release func(), old *agentConn, queued int, err error) {
	if !t.startTaking(hs) {
		return nil, nil, 0, ErrHeldByNewer
	}
	release, err = s.cfg.Cluster.Hold(ctx, t.id, hs.require, hs.instance)
	if errors.Is(err, ErrHeldByNewer) {
		s.stopTaking(t)
		return nil, nil, 0, err
	} else if err != nil {
		s.log.Warn("could not tell the other nodes this tunnel is here", "tunnel", t.id, "err", err)
		release = func() {}
	}
	s.recount(ctx, t)
	t.mu.Lock()
	if hs.instance.OlderThan(t.newest) || s.heldElsewhere(t, hs.instance) {
		// A later run came while this one was storing its hold: it
		// keeps the tunnel, whichever of the two gets here first.
		t.mu.Unlock()
		release()
		s.stopTaking(t)
		return nil, nil, 0, ErrHeldByNewer
	}
	defer t.mu.Unlock()
	t.taking--
	ac.queueHello(t.queued)
	old = t.agent
	t.agent = ac
	t.require = hs.require
	return release, old, t.queued, nil
}

// heldElsewhere reports whether another node took t after this one
// stored its hold for inst, before the agent took t here. The news of it
// (NodeHandlers.TakenOver) may have come already, and found no agent here
// to send away: the mirror has it, since this node's hold never replaces a
// later entry. An agent that did not say which run it is takes the tunnel
// as agents always did. t.mu is held.
func (s *Server) heldElsewhere(t *tunnel, inst wire.Instance) bool {
	if inst.IsZero() {
		return false
	}
	h := s.cfg.Cluster.Holder(t.id)
	return h.Node != "" && h.Node != s.cfg.Cluster.Self() && !h.Instance.OlderThan(inst)
}

// startTaking counts hs's agent among those taking t, unless an agent run
// started later was let in before it.
func (t *tunnel) startTaking(hs *handshake) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if hs.instance.OlderThan(t.newest) {
		return false
	}
	if !hs.instance.IsZero() {
		t.newest = hs.instance
	}
	t.taking++
	return true
}

// stopTaking ends the count of an agent refused after startTaking.
func (s *Server) stopTaking(t *tunnel) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.taking--
	s.forgetCount(t)
}

// leaveTunnel takes ac off t once its connection is over.
func (s *Server) leaveTunnel(t *tunnel, ac *agentConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.agent == ac {
		t.agent = nil
	}
	s.forgetCount(t)
}

// forgetCount drops t's queue count once no agent holds or takes t here.
// The stream counts this tunnel's queue, and the node its agent reaches
// next recounts it: a count left here would never come down. This node's
// inserts under way keep their places. An agent taking the tunnel here
// counts it itself. t.mu is held.
func (s *Server) forgetCount(t *tunnel) {
	if s.shared && t.agent == nil && t.taking == 0 {
		t.queued, t.queuedBytes = t.storing, 0
	}
}
