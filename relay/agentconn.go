// The relay's end of an agent's websocket: the read loop, and the live
// requests waiting for their answers.

package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// agentConn is the relay's end of one agent's websocket.
type agentConn struct {
	*frameconn.Conn
	srv *Server
	t   *tunnel

	nextStream atomic.Uint64

	mu      sync.Mutex          // guards pending, queued and freezing; held for map reads and writes only
	pending map[uint64]*pending // guarded by mu: live requests by stream
	queued  map[uint64]int64    // guarded by mu: queued requests sent, stream → queue seq
	window  chan struct{}       // semaphore of queued requests awaiting ack
	acked   chan int64          // queue seqs the agent acknowledged, for drainLoop to delete

	// The agent taken for frozen (frozen.go). frozen is set under mu,
	// with the live requests in flight taken for copies, and read without
	// it (away); freezing is what those requests wait on.
	frozen       atomic.Pointer[freeze] // nil while the agent answers
	freezing     chan struct{}          // guarded by mu: closed at the verdict; made again by the first request after it
	verdictTimer atomic.Bool            // a timer is armed to look for the verdict (probed)
	orphans      map[uint64]string      // guarded by mu: live requests queued as copies, unanswered: stream → request id
	orphansOut   chan struct{}          // guarded by mu: closed once orphans is empty again; nil while it is
	answered     map[string]bool        // guarded by mu: ids of orphans the agent answered, whose copies it is not sent

	// intake is read-held while a request frame is sent, so that the
	// goaway answering the agent's leave follows every request sent to it.
	intake  sync.RWMutex
	leaving bool // guarded by intake: the agent said leave
}

// roundTrip's errors for a request that goes to the queue instead.
var (
	// errAgentLeft: the agent is stopping; the request was not sent.
	errAgentLeft = errors.New("relay: the agent is stopping")
	// errAgentFrozen: the agent is taken for frozen; the request was not
	// sent, and queues behind the copies of those it was (away).
	errAgentFrozen = errors.New("relay: the agent is taken for frozen")
	// errRequeued: the request was sent, the agent was then taken for
	// frozen, and the request is queued (its sender answered already).
	errRequeued = errors.New("relay: the request was queued when the agent was taken for frozen")
)

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

	// An agent taken for frozen has its live requests queued (frozen.go):
	// frozen is closed then, and turn and copied were set before.
	frozen <-chan struct{} // agentConn.freezing when it was sent
	turn   chan struct{}   // guarded by agentConn.mu; closed by copyInFlight when its turn to be queued comes
	copied chan struct{}   // guarded by agentConn.mu; closed by its round trip once it is queued, or needs no copy
}

// freeze is one stretch of an agent taken for frozen.
type freeze struct {
	since  time.Time     // the agent's last pong
	copied chan struct{} // closed once the live requests in flight at the verdict are queued
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
		TunnelID: t.base.id, Name: t.name, PublicURL: s.TunnelURL(t.base.id), MaxBody: s.cfg.MaxBody, MaxFrame: s.cfg.MaxFrame, Queued: queued, Version: s.cfg.Version,
		ForwardTimeoutMS: s.cfg.ForwardTimeout.Milliseconds(), Leave: true, Claims: t.claims.Strings(),
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
// reports whether the agent said it saved the request. Should the agent
// be taken for frozen meanwhile, the request is queued in its turn by
// requeue, which answers its sender, and the error is errRequeued.
func (ac *agentConn) roundTrip(ctx context.Context, req *wire.Request, buf *bytes.Buffer, requeue func()) (*response, bool, error) {
	if !ac.admit() {
		return nil, false, errAgentLeft // buf is still the caller's
	}
	req.Stream = ac.nextStream.Add(1)
	p := &pending{acked: make(chan struct{}), resp: make(chan *response, 1)}
	if !ac.addPending(req.Stream, p) {
		ac.admitted()
		return nil, false, errAgentFrozen // buf is still the caller's
	}
	written := make(chan struct{})
	err := ac.Send(frameconn.Frame{Head: wire.AppendRequestHead(nil, req), Body: req.Body, Written: func() { close(written) }}, ctx.Done())
	ac.admitted()
	sent := err == nil
	var resp *response
	var acked bool
	if sent {
		resp, acked, err = ac.await(ctx, p)
	}
	taken, landed := ac.dropPending(req, p, sent && err != nil)
	if landed != nil {
		resp, acked, err = landed, true, nil
	}
	// The body buffer belongs to the frame until sendLoop is done with it.
	if taken && ac.copyInTurn(p, sent && err != nil, requeue) {
		releaseWhenWritten(written, buf)
		return nil, acked, errRequeued
	}
	<-written
	frameconn.PutBuf(buf)
	return resp, acked, err
}

// await waits for the agent's answer to p, until the sender or the
// forward timeout gives up (ctx), the connection closes, or the agent is
// taken for frozen (errAgentFrozen).
func (ac *agentConn) await(ctx context.Context, p *pending) (*response, bool, error) {
	select {
	case r := <-p.resp:
		return r, true, nil
	case <-ctx.Done():
		return nil, p.isAcked(), ctx.Err()
	case <-ac.Done():
		if r := p.landed(); r != nil {
			return r, true, nil
		}
		return nil, p.isAcked(), frameconn.ErrClosed
	case <-p.frozen:
		if r := p.landed(); r != nil {
			return r, true, nil
		}
		return nil, p.isAcked(), errAgentFrozen
	}
}

// copyInTurn settles the copy of p, a live request taken at the verdict,
// once its round trip is over. One still unanswered (needed) is queued in
// its turn by requeue, which answers its sender 202, whatever ended its
// wait (the verdict, its sender leaving, the connection's end): sent, it
// may reach the agent yet, but its copy is what reaches it for sure. One
// answered needs no copy. It reports whether p was queued.
func (ac *agentConn) copyInTurn(p *pending, needed bool, requeue func()) bool {
	defer close(p.copied)
	if !needed {
		return false
	}
	<-p.turn
	requeue()
	return true
}

// landed is a response that came just as the wait for it ended; nil if
// none did.
func (p *pending) landed() *response {
	select {
	case r := <-p.resp:
		return r
	default:
		return nil
	}
}

func (p *pending) isAcked() bool {
	select {
	case <-p.acked:
		return true
	default:
		return false
	}
}

// addPending registers a live request about to be sent; false, and
// nothing registered, while the agent is taken for frozen.
func (ac *agentConn) addPending(stream uint64, p *pending) bool {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	if ac.frozen.Load() != nil {
		return false
	}
	if ac.freezing == nil {
		ac.freezing = make(chan struct{})
	}
	p.frozen = ac.freezing
	ac.pending[stream] = p
	return true
}

// dropPending forgets a live request whose round trip is over, and
// reports whether the verdict took it for a copy (copyInTurn settles it).
// One taken and unanswered becomes an orphan, unless its response has
// landed after all: then that is returned.
func (ac *agentConn) dropPending(req *wire.Request, p *pending, unanswered bool) (taken bool, landed *response) {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	delete(ac.pending, req.Stream)
	if p.turn == nil {
		return false, nil
	}
	if unanswered {
		if landed = p.landed(); landed == nil {
			ac.addOrphan(req)
		}
	}
	return true, landed
}

// releaseWhenWritten gives buf back to the pool once its frame is written
// or dropped. A request queued from a frozen agent may still wait behind a
// write the agent does not read (until the write deadline ends it): its
// sender has its answer, and is not kept waiting for that.
func releaseWhenWritten(written <-chan struct{}, buf *bytes.Buffer) {
	select {
	case <-written:
		frameconn.PutBuf(buf)
	default:
		go func() {
			<-written
			frameconn.PutBuf(buf)
		}()
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
			if err := ac.answer(r, buf); err != nil {
				return err
			}
		default:
			typ := b[0] // b is the buffer's: read it before the buffer goes back
			frameconn.PutBuf(buf)
			return fmt.Errorf("%w: unexpected frame type 0x%02x from agent", wire.ErrMalformed, typ)
		}
	}
}

// answer hands a response to the live request waiting for it. One that
// nobody waits for (the sender gave up, or a response to a queued
// request) is dropped; if it answers an orphan (frozen.go), the drain
// waits for it no more. It is handed over under ac.mu, so that a round
// trip that ends meanwhile either finds it (dropPending) or leaves an
// orphan this finds.
func (ac *agentConn) answer(r *wire.Response, buf *bytes.Buffer) error {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	p := ac.pending[r.Stream]
	if p == nil {
		ac.orphanAnswered(r)
		frameconn.PutBuf(buf)
		return nil
	}
	select {
	case p.resp <- &response{Response: r, buf: buf}:
		return nil
	default:
		frameconn.PutBuf(buf)
		return fmt.Errorf("%w: two responses for stream %d", wire.ErrMalformed, r.Stream)
	}
}

// An orphan is a live request queued as a copy whose live frame the agent
// has not answered. It may read that frame yet, when it wakes, and then:
//   - it hands the live request to the handler at once, a queued one in
//     its turn: sent before the orphan's answer, a request queued after
//     it could reach the handler first. So the drain sends no queued
//     request while there is an orphan (awaitOrphans).
//   - its store knows a queued request sent again, not a live one queued:
//     the copy would reach the handler a second time. So the copy of an
//     orphan it answered is removed from the queue unsent (skipAnswered);
//     one whose handler it could not reach, or not in time, is sent, as
//     its sender would have sent it again.
//
// The answer ends the orphan (answer), and the connection's end ends the
// drain: the next connection gets every copy, and only the copies.

// addOrphan records an orphan. ac.mu is held.
func (ac *agentConn) addOrphan(req *wire.Request) {
	if ac.orphans == nil {
		ac.orphans = map[uint64]string{}
	}
	if len(ac.orphans) == 0 {
		ac.orphansOut = make(chan struct{})
	}
	ac.orphans[req.Stream] = req.ID
}

// orphanAnswered ends the orphan r answers, if there is one. ac.mu is
// held.
func (ac *agentConn) orphanAnswered(r *wire.Response) {
	id, ok := ac.orphans[r.Stream]
	if !ok {
		return
	}
	delete(ac.orphans, r.Stream)
	if len(ac.orphans) == 0 {
		close(ac.orphansOut)
		ac.orphansOut = nil
	}
	if r.Result == wire.ResultOK || r.Result == wire.ResultQueued {
		if ac.answered == nil {
			ac.answered = map[string]bool{}
		}
		ac.answered[id] = true
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
	ac.t.delivered.Add(1)
	ac.acked <- seq // never blocks: at most drainWindow are unacknowledged
}
