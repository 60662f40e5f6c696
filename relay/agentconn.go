// The relay's end of an agent's websocket: the handshake, the read loop,
// and the live requests waiting for their answers.

package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay/api"
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
		return // the upgrader answered already
	}
	s.serveAgent(r, conn, hs)
}

// handshake is what an agent's upgrade request says.
type handshake struct {
	tok      *relaystate.Token
	require  []wire.HeaderField // headers every sender must present
	agentMax int64              // the largest frame the agent reads
	instance wire.Instance      // which agent run; zero if it did not say
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
	for _, v := range r.Header.Values(wire.RequireHeaderHeader) {
		name, value, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, api.Invalid("%s must be 'Name: value'", wire.RequireHeaderHeader)
		}
		hs.require = append(hs.require, wire.HeaderField{Name: strings.TrimSpace(name), Value: strings.TrimSpace(value)})
	}
	if v := r.Header.Get(wire.MaxFrameHeader); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return nil, api.Invalid("%s must be a positive number of bytes", wire.MaxFrameHeader)
		}
		hs.agentMax = n
	}
	if v := r.Header.Get(wire.InstanceHeader); v != "" {
		inst, err := wire.ParseInstance(v)
		if err != nil {
			return nil, api.Invalid("%v", err)
		}
		hs.instance = inst
	}
	return hs, nil
}

// serveAgent makes the agent on conn its tunnel's, and serves it until the
// connection ends.
func (s *Server) serveAgent(r *http.Request, conn *frameconn.Conn, hs *handshake) {
	t := s.tunnelFor(hs.tok.TunnelID, hs.tok.Name)
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
		return
	}
	defer release()
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
	log := s.log.With("tunnel", t.id, "name", t.name)
	log.Info("agent connected", "remote", r.RemoteAddr, "queued", queued)
	var loops sync.WaitGroup
	loops.Go(ac.SendLoop) // the hello is first in its queue (takeTunnel)
	loops.Go(ac.drainLoop)
	err = ac.readLoop()
	ac.Close(err)
	ac.failPending()
	loops.Wait()
	s.leaveTunnel(t, ac)
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

// agentConn is the relay's end of one agent's websocket.
type agentConn struct {
	*frameconn.Conn
	srv *Server
	t   *tunnel

	nextStream atomic.Uint64

	mu      sync.Mutex          // guards pending and queued; held for map reads and writes only
	pending map[uint64]*pending // guarded by mu: live requests by stream
	queued  map[uint64]int64    // guarded by mu: queued requests sent, stream → queue seq
	window  chan struct{}       // semaphore of queued requests awaiting ack
	acked   chan int64          // queue seqs the agent acknowledged, for drainLoop to delete

	// intake is read-held while a request frame is sent, so that the
	// goaway answering the agent's leave follows every request sent to it.
	intake  sync.RWMutex
	leaving bool // guarded by intake: the agent said leave
}

// errAgentLeft is roundTrip's error for an agent that is stopping: the
// request was not sent, and is queued instead.
var errAgentLeft = errors.New("relay: the agent is stopping")

// admit holds the intake open for one request frame; false, and nothing
// held, once the agent is leaving. admitted ends the hold.
func (ac *agentConn) admit() bool {
	ac.intake.RLock()
	if ac.leaving {
		ac.intake.RUnlock()
		return false
	}
	return true
}

func (ac *agentConn) admitted() { ac.intake.RUnlock() }

// leave answers an agent that stops: its tunnel takes no more requests
// here (they queue, or go to an agent that connects meanwhile), and the
// goaway "left" tells it that none follows. Its answers in flight still
// reach their senders.
func (ac *agentConn) leave() {
	ac.intake.Lock()
	ac.leaving = true
	ac.intake.Unlock()
	t := ac.t
	t.mu.Lock()
	if t.agent == ac {
		t.agent = nil
	}
	t.mu.Unlock()
	ac.Send(frameconn.Frame{Head: wire.AppendGoAway(nil, wire.GoAway{Reason: wire.GoAwayLeft, Message: "no more requests on this connection"})}, nil)
}

// pending is a live request waiting for its ack and response.
type pending struct {
	acked chan struct{}  // closed on ack
	resp  chan *response // cap 1
}

// response is a decoded response frame and the buffer behind it.
type response struct {
	*wire.Response
	buf *bytes.Buffer
}

func (r *response) release() { frameconn.PutBuf(r.buf) }

// goAway tells the agent why it is being dropped, then closes.
func (ac *agentConn) goAway(g wire.GoAway) {
	done := make(chan struct{})
	err := ac.Send(frameconn.Frame{Head: wire.AppendGoAway(nil, g), Written: func() { close(done) }}, nil)
	if err == nil {
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
	}
	ac.WriteClose(websocket.CloseNormalClosure, g.Message)
	ac.Close(fmt.Errorf("goaway: %s", g.Message))
}

// queueHello puts the relay's hello first in the connection's queue,
// before the tunnel's requests can find the agent: it reads none before
// the hello. t.mu is held.
func (ac *agentConn) queueHello(queued int) {
	s, t := ac.srv, ac.t
	ac.TrySend(frameconn.Frame{Head: wire.AppendHello(nil, &wire.Hello{
		TunnelID: t.id, Name: t.name, PublicURL: s.TunnelURL(t.id), MaxBody: s.cfg.MaxBody, MaxFrame: s.cfg.MaxFrame, Queued: queued, Version: s.cfg.Version,
		ForwardTimeoutMS: s.cfg.ForwardTimeout.Milliseconds(), Leave: true,
	})})
}

// refuse sends away an agent that never took its tunnel.
func (ac *agentConn) refuse(g wire.GoAway) {
	var loops sync.WaitGroup
	loops.Go(ac.SendLoop) // ends with the close
	ac.goAway(g)
	loops.Wait()
}

// roundTrip sends req and waits for the agent's ack and response. acked
// reports whether the agent said it saved the request.
func (ac *agentConn) roundTrip(ctx context.Context, req *wire.Request, buf *bytes.Buffer) (*response, bool, error) {
	if !ac.admit() {
		return nil, false, errAgentLeft // buf is still the caller's
	}
	req.Stream = ac.nextStream.Add(1)
	p := &pending{acked: make(chan struct{}), resp: make(chan *response, 1)}
	ac.mu.Lock()
	ac.pending[req.Stream] = p
	ac.mu.Unlock()
	defer func() {
		ac.mu.Lock()
		delete(ac.pending, req.Stream)
		ac.mu.Unlock()
	}()
	written := make(chan struct{})
	err := ac.Send(frameconn.Frame{Head: wire.AppendRequestHead(nil, req), Body: req.Body, Written: func() { close(written) }}, ctx.Done())
	ac.admitted()
	// The body buffer belongs to the frame until sendLoop is done with it.
	defer func() { <-written; frameconn.PutBuf(buf) }()
	if err != nil {
		return nil, false, err
	}
	isAcked := func() bool {
		select {
		case <-p.acked:
			return true
		default:
			return false
		}
	}
	select {
	case r := <-p.resp:
		return r, true, nil
	case <-ctx.Done():
		return nil, isAcked(), ctx.Err()
	case <-ac.Done():
		// A response may have landed just before the close.
		select {
		case r := <-p.resp:
			return r, true, nil
		default:
		}
		return nil, isAcked(), frameconn.ErrClosed
	}
}

// failPending forgets the queued requests in flight: they stay in the
// queue and go again on the next connection. Live waiters need no wake-up:
// they watch ac.done.
func (ac *agentConn) failPending() {
	ac.mu.Lock()
	ac.queued = map[uint64]int64{}
	ac.mu.Unlock()
}

// readLoop is the connection's only reader.
func (ac *agentConn) readLoop() error {
	for {
		buf, err := ac.ReadFrame()
		if err != nil {
			return err
		}
		b := buf.Bytes()
		switch b[0] {
		case wire.FrameLeave:
			frameconn.PutBuf(buf)
			go ac.leave() // it may wait for a request frame being sent
		case wire.FrameAck:
			stream, err := wire.DecodeAck(b)
			frameconn.PutBuf(buf)
			if err != nil {
				return err
			}
			ac.handleAck(stream.Stream)
		case wire.FrameResponse:
			r, err := wire.DecodeResponse(b)
			if err != nil {
				frameconn.PutBuf(buf)
				return err
			}
			ac.mu.Lock()
			p := ac.pending[r.Stream]
			ac.mu.Unlock()
			if p == nil {
				frameconn.PutBuf(buf) // the sender gave up, or a response to a queued request
				continue
			}
			select {
			case p.resp <- &response{Response: r, buf: buf}:
			default:
				frameconn.PutBuf(buf)
				return fmt.Errorf("%w: two responses for stream %d", wire.ErrMalformed, r.Stream)
			}
		default:
			typ := b[0] // b is the buffer's: read it before the buffer goes back
			frameconn.PutBuf(buf)
			return fmt.Errorf("%w: unexpected frame type 0x%02x from agent", wire.ErrMalformed, typ)
		}
	}
}

func (ac *agentConn) handleAck(stream uint64) {
	ac.mu.Lock()
	p := ac.pending[stream]
	seq, isQueued := ac.queued[stream]
	delete(ac.queued, stream)
	ac.mu.Unlock()
	if p != nil {
		select {
		case <-p.acked:
		default:
			close(p.acked)
		}
		return
	}
	if !isQueued {
		return
	}
	// Ack means the agent saved it: only now may the relay forget it.
	// It no longer stands before a live request, which may go straight to
	// the agent now; drainLoop deletes it from the store, with the other
	// acks that came meanwhile, and a slow or failing delete (a NATS
	// failover) must not hold live requests back.
	ac.t.countOut()
	ac.acked <- seq // never blocks: at most drainWindow are unacknowledged
}
