// A node's lease: the fence that keeps a node cut off from NATS from
// delivering live requests while the other nodes queue its tunnels'.
//
// Without it, a node holding an agent that loses NATS (its link cut, its
// server gone) goes on delivering the live requests its own senders bring,
// while the other nodes, whose forwards find nobody listening, queue theirs
// (relay.ErrNodeGone): the queued ones reach the handler when the node is
// back, behind live ones accepted after them (chaos run, team seed 3301:
// 125 requests out of order).
//
// The lease is a heartbeat in stream CALLTAP_NODES, subject
// calltap.alive.<node>, one message per node, read from the stream's
// leader (no direct gets: a lagging replica could miss the newest beat):
//
//   - The holding node publishes a beat every leaseEvery. A beat whose
//     publish JetStream acknowledged extends the node's term to its sending
//     time plus leaseTime, on the node's monotonic clock. The node delivers
//     live only within its term; out of it, what it takes is queued (and
//     refused 503 if the queue cannot be reached either).
//   - A forwarding node that finds nobody listening on the holder's subject
//     reads the holder's newest beat, and again until goneAfter
//     (> leaseTime) has passed on its own clock since the first read came
//     back. A new beat means the holder lives: the sender is told to retry
//     (the request reached nobody). No new beat means every term the holder
//     had has ended: it is gone, and the request is queued.
//   - A node whose term ran out has lost its lease: when beats are
//     acknowledged again, it waits regainAfter (longer than a forwarding
//     node takes from its last read to its queued request's ack), then
//     counts its tunnels' queues again and wakes their drains
//     (NodeHandlers.Regained), and only then delivers live again.
//
// Only the two machines' own clocks are compared with themselves: no clock
// of one is read against another's.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	streamNodes  = "CALLTAP_NODES"
	subjectAlive = "calltap.alive." // + node

	leaseEvery = 500 * time.Millisecond // how often a node beats
	leaseTime  = 2 * time.Second        // how long an acknowledged beat lets it deliver live
	goneAfter  = leaseTime + time.Second
	goneCheck  = 250 * time.Millisecond // how often a forwarding node reads the holder's beat
)

// errHolderUnreachable is Forward's error when nobody listens on the
// holding node's subject but its beat goes on: it is cut off from this
// node, not gone, and may still deliver live. The request reached nobody;
// its sender retries.
var errHolderUnreachable = errors.New("cluster: the node holding the agent cannot be reached, and still holds its lease")

// lease is this node's heartbeat and its reading of the others'.
type lease struct {
	*link
	stream      jetstream.Stream
	node        string
	regainAfter time.Duration // 2 × the request timeout and a margin: see the package comment
	base        time.Time     // origin of until's clock (monotonic)

	// until is the end of the term, in nanoseconds since base; 0 while the
	// lease is not held. Written by run only; read by Leased on any
	// goroutine.
	until atomic.Int64
}

func newLease(l *link, st jetstream.Stream, node string) *lease {
	return &lease{link: l, stream: st, node: node, regainAfter: 2*l.timeout + 500*time.Millisecond, base: time.Now()}
}

func (l *lease) now() time.Duration { return time.Since(l.base) }

// Leased implements relay.Cluster.
func (c *Cluster) Leased() bool {
	u := c.lease.until.Load()
	return u != 0 && c.lease.now() < time.Duration(u)
}

// leaseState is run's own: no other goroutine reads it.
type leaseState struct {
	term    time.Duration // end of the newest acknowledged beat's term
	held    bool          // until is set
	lapsed  bool          // the lease ran out after it was held: regaining it waits and recounts
	resumed time.Duration // when beats were acknowledged again after a lapse
}

// run beats until ctx ends, and sets until; first is closed after the
// first beat, so that a node starts with its lease.
func (l *lease) run(ctx context.Context, regained func(), first chan<- struct{}) {
	tick := time.NewTicker(leaseEvery)
	defer tick.Stop()
	var st leaseState
	for {
		sent := l.now()
		ok := l.beat(ctx)
		l.step(&st, sent, ok, regained)
		if first != nil {
			close(first)
			first = nil
		}
		select {
		case <-ctx.Done():
			l.until.Store(0)
			return
		case <-tick.C:
		}
	}
}

// step takes one beat's outcome into st. A term that ran out, even for a
// moment, is a lapse: the lease is regained only the long way.
func (l *lease) step(st *leaseState, sent time.Duration, ok bool, regained func()) {
	now := l.now()
	if st.held && now >= st.term {
		st.held, st.lapsed, st.resumed = false, true, 0
		l.until.Store(0)
		l.log.Warn("this node lost its lease in NATS: live requests are queued until it is back", "node", l.node)
	}
	if ok {
		if st.lapsed && (st.resumed == 0 || now >= st.term) {
			st.resumed = now // acknowledged again after the term ran out
		}
		st.term = sent + leaseTime
	}
	if st.held {
		l.until.Store(int64(st.term))
		return
	}
	if now >= st.term || (st.lapsed && now-st.resumed < l.regainAfter) {
		return
	}
	if st.lapsed {
		regained()
		l.log.Info("this node has its lease in NATS again: live requests flow", "node", l.node)
	}
	st.held, st.lapsed = true, false
	l.until.Store(int64(st.term))
}

// beat publishes one heartbeat and reports whether JetStream stored it in
// time to be of use.
func (l *lease) beat(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, min(leaseTime, l.timeout))
	defer cancel()
	_, err := l.js.Publish(ctx, subjectAlive+l.node, nil)
	return err == nil
}

// gone tells, for a node nobody listens for, whether it is gone for good
// (relay.ErrNodeGone: its requests may be queued) or still beating
// (errHolderUnreachable).
func (l *lease) gone(ctx context.Context, node string) error {
	first, err := l.lastBeat(ctx, node)
	if err != nil || first == 0 {
		return err
	}
	deadline := time.Now().Add(goneAfter)
	wait := time.NewTicker(goneCheck)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wait.C:
		}
		started := time.Now()
		seq, err := l.lastBeat(ctx, node)
		switch {
		case err != nil:
			return err
		case seq != first:
			return errHolderUnreachable
		case started.After(deadline):
			return relay.ErrNodeGone
		}
	}
}

// lastBeat is the stream sequence of node's newest beat; 0 and
// relay.ErrNodeGone if it has none (it never beat, or not for the
// stream's max age).
func (l *lease) lastBeat(ctx context.Context, node string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	m, err := l.stream.GetLastMsgForSubject(ctx, subjectAlive+node)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, relay.ErrNodeGone
	case err != nil:
		return 0, fmt.Errorf("read the lease of node %s: %w", node, err)
	}
	return m.Sequence, nil
}
