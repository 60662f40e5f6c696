// An agent's arrival: its handshake, and which agent holds its tunnel.
// One token serves one agent, and of two agent runs on one token the one
// started later keeps it. Without that order two agents sent away by each
// other would each come back to make sure, and leave the tunnel to
// nobody.

package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaystate"
	"github.com/gorilla/websocket"
)

// serveConnect upgrades an agent's connection after checking its token
// and handshake, and serves it until it ends.
func (s *Server) serveConnect(w http.ResponseWriter, r *http.Request) {
	hs, e := s.readHandshake(r)
	if e != nil {
		s.fail(w, e)
		return
	}
	seat, e := s.registerSeat(r.Context(), hs)
	if e != nil {
		s.fail(w, e)
		return
	}
	s.mu.Lock()
	closing := s.closing
	if !closing {
		s.conns.Add(1) // Run waits for this connection once it shuts down
	}
	s.mu.Unlock()
	if closing {
		w.Header().Set("Retry-After", "1")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "relay shutting down"))
		return
	}
	defer s.conns.Done()
	conn, err := frameconn.Accept(&s.upgrader, w, r, s.cfg.MaxFrame, s.cfg.Keepalive)
	if err != nil {
		s.leaveSeat(seat) // registered connected, and no agent came
		return            // the upgrader answered already
	}
	s.serveAgent(r, conn, hs, seat)
}

// handshake is what an agent's upgrade request says.
type handshake struct {
	tok      *relaystate.Token
	require  []wire.HeaderField // headers every sender must present
	agentMax int64              // the largest frame the agent reads
	instance wire.Instance      // which agent run; zero if it did not say
	claims   claim.Set          // what it claims; empty for the token's default agent
}

// readHandshake checks an agent's upgrade request: its token, the
// protocol it speaks, and what it asks of the relay.
func (s *Server) readHandshake(r *http.Request) (*handshake, *api.Error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return nil, api.Errorf(http.StatusUnauthorized, api.CodeUnauthorized, "missing bearer token")
	}
	tok, err := s.cfg.Store.Authenticate(r.Context(), token)
	if errors.Is(err, relaystate.ErrNotFound) {
		return nil, api.Errorf(http.StatusUnauthorized, api.CodeUnauthorized, "token is not valid or was revoked")
	} else if err != nil {
		s.log.Error("authenticate", "err", err)
		return nil, api.Errorf(http.StatusInternalServerError, api.CodeInternal, "internal error")
	}
	if !websocket.IsWebSocketUpgrade(r) {
		return nil, api.Invalid("expected a websocket upgrade")
	}
	if !offers(r, wire.Subprotocol) {
		return nil, api.Invalid("this relay speaks %s; upgrade calltap", wire.Subprotocol)
	}
	hs := &handshake{tok: tok, agentMax: wire.DefaultMaxFrame} // an agent that does not say reads what calltap's agents always did
	if e := hs.readAsks(r); e != nil {
		return nil, e
	}
	return hs, nil
}

// readAsks reads what the agent asks of the relay: what senders must
// present, the largest frame it reads, which run it is, what it claims.
func (hs *handshake) readAsks(r *http.Request) *api.Error {
	for _, v := range r.Header.Values(wire.RequireHeaderHeader) {
		name, value, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return api.Invalid("%s must be 'Name: value'", wire.RequireHeaderHeader)
		}
		hs.require = append(hs.require, wire.HeaderField{Name: strings.TrimSpace(name), Value: strings.TrimSpace(value)})
	}
	if v := r.Header.Get(wire.MaxFrameHeader); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return api.Invalid("%s must be a positive number of bytes", wire.MaxFrameHeader)
		}
		hs.agentMax = n
	}
	claims, err := claim.ParseSet(r.Header.Values(wire.ClaimHeader))
	if err != nil {
		return api.Invalid("%s: %v", wire.ClaimHeader, err)
	}
	hs.claims = claims
	if v := r.Header.Get(wire.InstanceHeader); v != "" {
		inst, err := wire.ParseInstance(v)
		if err != nil {
			return api.Invalid("%v", err)
		}
		hs.instance = inst
	}
	return nil
}

// serveAgent makes the agent on conn seat t's, and serves it until the
// connection ends.
func (s *Server) serveAgent(r *http.Request, conn *frameconn.Conn, hs *handshake, t *tunnel) {
	ac := &agentConn{
		Conn:    conn,
		srv:     s,
		t:       t,
		pending: map[uint64]*pending{},
		queued:  map[uint64]int64{},
		window:  make(chan struct{}, drainWindow),
		acked:   make(chan int64, drainWindow),
	}
	ac.SetPeerMax(hs.agentMax)
	release, old, queued, err := s.takeTunnel(r.Context(), t, ac, hs)
	if err != nil {
		s.log.Info("agent refused: a later agent run holds its tunnel", "tunnel", t.id, "name", t.name, "remote", r.RemoteAddr)
		ac.refuse(wire.GoAway{Reason: wire.GoAwayHeld, Message: fmt.Sprintf("another agent connected with the same token, started later, and took over this tunnel (token %s)", t.name)})
		s.leaveSeat(t) // registered connected: away, unless the later run holds it
		return
	}
	defer release()
	if t.base != t && len(hs.require) > 0 {
		// What senders must present is the token's: the agent that
		// connected last and asked for it says it, whichever seat it
		// takes. A claimant that asks nothing leaves the check as the
		// others set it: one developer's agent must not open the
		// team's URL to any sender.
		t.base.mu.Lock()
		t.base.require = hs.require
		t.base.mu.Unlock()
	}
	if old != nil {
		old.goAway(wire.GoAway{Reason: wire.GoAwayReplaced, Message: "another agent connected with the same token and took over this tunnel"})
	}
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		// shutdown may have looked for agents before this one took its
		// tunnel: send it away here, or Run would wait for it for good.
		ac.goAway(wire.GoAway{Reason: wire.GoAwayShutdown, Message: "relay shutting down"})
	}
	s.metrics.agentsConnected.Add(1)
	log := s.log.With("tunnel", t.base.id, "name", t.name)
	if t.base != t {
		log = log.With("seat", t.id, "claims", strings.Join(t.claims.Strings(), " "))
	}
	log.Info("agent connected", "remote", r.RemoteAddr, "queued", queued)
	var loops sync.WaitGroup
	ac.OnProbe(ac.probed) // a frozen agent is taken for away (frozen.go)
	loops.Go(ac.SendLoop) // the hello is first in its queue (takeTunnel)
	loops.Go(ac.drainLoop)
	err = ac.readLoop()
	ac.Close(err)
	ac.failPending()
	loops.Wait()
	s.leaveTunnel(t, ac)
	s.leaveSeat(t)
	s.metrics.agentsConnected.Add(-1)
	log.Info("agent disconnected", "reason", ac.Cause())
}

func offers(r *http.Request, proto string) bool {
	for _, p := range websocket.Subprotocols(r) {
		if p == proto {
			return true
		}
	}
	return false
}

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
