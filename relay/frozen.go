// A frozen agent: connected, and silent. A laptop whose lid closes, or an
// agent process stopped, keeps its websocket open, and the relay would
// keep its senders waiting on it until their forward timeout. An agent
// silent for frozenAfter is taken for away while its connection stays
// open: its requests queue (202), in order, and reach it when it answers
// again, over the same connection, or over its next one.

package relay

import (
	"context"
	"slices"
	"time"

	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaystate"
)

// frozenAfter is how long an agent may owe a pong before it is taken for
// frozen. The relay pings it every second (frameconn.DefaultProbeEvery),
// and one that reads answers within milliseconds: one silent this long is
// stopped, or reads nothing, and its senders are better served by the
// queue than by a wait. It is also the longest a sender waits for a
// frozen agent: the silence counts from the agent's last pong
// (frameconn.Conn.Silence), which came before any request it has left
// unanswered was sent.
const frozenAfter = 3 * time.Second

// freeze is one stretch of an agent taken for frozen.
type freeze struct {
	since  time.Time     // the agent's last pong
	copied chan struct{} // closed once the live requests in flight at the verdict are queued
}

// probed looks for the verdict, or for its end; the connection's send loop
// calls it at each ping's tick, and a timer when the verdict falls due
// between two ticks. It never blocks.
func (ac *agentConn) probed() {
	select {
	case <-ac.Done():
		return // the tunnel's requests queue anyway
	default:
	}
	silence := ac.Silence()
	f := ac.frozen.Load()
	switch {
	case f == nil && silence >= frozenAfter:
		ac.freeze(silence)
	case f == nil && silence >= frozenAfter/2:
		// The verdict may fall due before the next tick: a timer makes it
		// on time. Only a late pong arms one, never an idle tunnel.
		if ac.verdictTimer.CompareAndSwap(false, true) {
			time.AfterFunc(frozenAfter-silence, func() {
				ac.verdictTimer.Store(false)
				ac.probed()
			})
		}
	case f != nil:
		ac.thawIfAnswering(f)
	}
}

// freeze takes the agent for frozen: the live requests registered from
// now on are refused (addPending), and those in flight are taken, in the
// order they were sent, to be queued in turn (copyInFlight).
//
// Why the order holds: the verdict is set, and the requests in flight
// taken, under ac.mu, which a live request holds to register; so each is
// either taken here or refused after. A taken one is queued by its own
// round trip (it has the sender to answer) when its turn comes, and the
// next turn waits until it is stored. A request refused, or arriving
// after the verdict (forwardOrQueue), waits in away until the last copy
// is stored, and only then is queued itself. Each copy follows its live
// frame on the connection (its round trip sent the frame before it took
// its turn): an agent that wakes saves the live one first and the copy is
// a redelivery it knows by its id; if the connection dies instead, the
// copy is what reaches the agent. With the relay in reject mode nothing
// is queued: the requests in flight keep waiting, and new ones are
// refused (503).
func (ac *agentConn) freeze(silence time.Duration) {
	f := &freeze{since: time.Now().Add(-silence), copied: make(chan struct{})}
	ac.mu.Lock()
	if !ac.frozen.CompareAndSwap(nil, f) {
		ac.mu.Unlock()
		return
	}
	var taken []*pending
	if ac.srv.cfg.Offline == OfflineQueue && ac.freezing != nil {
		taken = ac.takeInFlight()
	}
	ac.mu.Unlock()
	ac.srv.metrics.agentsFrozen.Add(1)
	ac.srv.log.Warn("agent taken for frozen: it has not answered a ping; its requests queue until it does",
		"tunnel", ac.t.base.id, "seat", ac.t.id, "silent", silence.Round(time.Millisecond), "in_flight", len(taken))
	if len(taken) == 0 {
		close(f.copied)
		return
	}
	go ac.copyInFlight(f, taken)
}

// takeInFlight marks the live requests in flight for copies, and returns
// them in the order they were sent. ac.mu is held.
func (ac *agentConn) takeInFlight() []*pending {
	streams := make([]uint64, 0, len(ac.pending))
	for stream := range ac.pending {
		streams = append(streams, stream)
	}
	slices.Sort(streams)
	taken := make([]*pending, len(streams))
	for i, stream := range streams {
		p := ac.pending[stream]
		p.turn, p.copied = make(chan struct{}), make(chan struct{})
		taken[i] = p
	}
	close(ac.freezing) // wakes their round trips
	ac.freezing = nil
	return taken
}

// copyInFlight gives the requests taken at the verdict their turns to be
// queued, one after another, then lets the requests that came after them
// be queued (f.copied).
func (ac *agentConn) copyInFlight(f *freeze, taken []*pending) {
	for _, p := range taken {
		close(p.turn)
		<-p.copied
	}
	close(f.copied)
}

// copyInTurn settles the copy of p, a live request taken at the verdict,
// once its round trip is over: one still without its answer (needed) is
// queued by requeue in its turn, which answers its sender, whatever ended
// its wait (the verdict, its sender leaving, the timeout, the connection
// closing: sent, it might be handled yet, and the copy is the one that
// reaches the agent for sure); one that has it needs no copy. It reports
// whether p was queued.
func (ac *agentConn) copyInTurn(p *pending, needed bool, requeue func()) bool {
	defer close(p.copied)
	if !needed {
		return false
	}
	<-p.turn
	requeue()
	return true
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

// awaitOrphans returns once there is no orphan, removing from the queue
// what the agent acknowledges meanwhile; false once the connection has
// closed.
func (ac *agentConn) awaitOrphans() bool {
	for {
		ac.mu.Lock()
		out := ac.orphansOut
		ac.mu.Unlock()
		if out == nil {
			return true
		}
		select {
		case <-out:
		case seq := <-ac.acked:
			ac.dequeueAcked(seq)
		case <-ac.Done():
			ac.flushAcked()
			return false
		}
	}
}

// skipAnswered removes q from the queue unsent if it is the copy of an
// orphan the agent answered, and reports whether it did. A copy that
// cannot be removed is left, and not sent on this connection.
func (ac *agentConn) skipAnswered(q *relaystate.QueuedRequest) bool {
	ac.mu.Lock()
	skip := ac.answered[q.ID]
	delete(ac.answered, q.ID)
	ac.mu.Unlock()
	if !skip {
		return false
	}
	if err := ac.srv.cfg.Store.Dequeue(context.Background(), q.Seq); err != nil {
		ac.srv.log.Error("dequeue the copy of a request the agent answered", "tunnel", ac.t.base.id, "seat", ac.t.id, "id", q.ID, "err", err)
	}
	ac.t.countOut()
	ac.t.delivered.Add(1)
	return true
}

// away reports whether the agent is taken for frozen; if it is, away
// returns once the requests in flight at the verdict are queued, for a
// request arriving after them to be queued after them. The first request
// after the agent's pong ends the verdict, without waiting for the next
// ping's look.
func (ac *agentConn) away() bool {
	f := ac.frozen.Load()
	if f == nil {
		return false
	}
	<-f.copied
	return !ac.thawIfAnswering(f)
}

// thawIfAnswering ends the verdict f once the agent has answered a ping
// since, and the requests in flight at the verdict are queued; it reports
// whether f is over. The queue drains to the agent over this connection
// (it never stopped: what it was sent meanwhile waits in its socket), and
// live requests go to it again once the queue is empty, as after any wait
// in the queue.
func (ac *agentConn) thawIfAnswering(f *freeze) bool {
	if ac.Silence() >= frozenAfter {
		return false
	}
	select {
	case <-f.copied:
	default:
		return false // the next look ends it
	}
	if ac.frozen.CompareAndSwap(f, nil) {
		ac.srv.log.Info("agent answers again: its queue drains to it",
			"tunnel", ac.t.base.id, "seat", ac.t.id, "frozen_for", time.Since(f.since).Round(time.Millisecond))
	}
	return true
}
