// A frozen agent: connected, and silent. A laptop whose lid closes, or an
// agent process stopped, keeps its websocket open, and the relay would
// keep its senders waiting on it until their forward timeout. An agent
// silent for frozenAfter is taken for away while its connection stays
// open: its requests queue (202), in order, and reach it when it answers
// again, over the same connection, or over its next one.

package relay

import (
	"slices"
	"time"
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
// its turn), and waits in the queue for the agent's answer to it (an
// orphan's, agentconn.go): an agent that wakes reads the live one, and
// its copy is removed unsent; if the connection dies instead, the copy is
// what reaches the agent. With the relay in reject mode nothing is
// queued: the requests in flight keep waiting, and new ones are refused
// (503).
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
// whether f is over. The queue drains to the agent over this connection,
// once it has answered what it was sent before the verdict (the drain
// waits for the orphans), and live requests go to it again once the queue
// is empty, as after any wait in the queue.
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
