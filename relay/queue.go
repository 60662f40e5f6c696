// The offline queue: requests kept for an absent agent, drained to it in
// arrival order when it connects, and removed once it has saved them.

package relay

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaystate"
)

// enqueue keeps a request for an absent agent, or refuses it in reject mode.
func (s *Server) enqueue(w http.ResponseWriter, ctx context.Context, t *tunnel, req *wire.Request, log reqLogger) {
	if s.cfg.Offline == OfflineReject {
		w.Header().Set("Retry-After", "30")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeAgentOffline, "no agent is connected to this tunnel; retry later"))
		return
	}
	head := wire.AppendHeader(nil, req.Header)
	size := int64(len(req.Body) + len(head) + len(req.URI))
	t.mu.Lock()
	if t.queued >= s.cfg.QueueMaxCount || t.queuedBytes+size > s.cfg.QueueMaxBytes {
		t.mu.Unlock()
		w.Header().Set("Retry-After", "60")
		log.Warn("offline queue full", "max_count", s.cfg.QueueMaxCount, "max_bytes", s.cfg.QueueMaxBytes)
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeQueueFull, "the offline queue of this tunnel is full; retry later"))
		return
	}
	// Reserve the place first, so a request arriving now also queues
	// behind this one instead of overtaking it.
	t.queued++
	t.queuedBytes += size
	t.storing++
	t.mu.Unlock()
	err := s.cfg.Store.Enqueue(context.WithoutCancel(ctx), &relaystate.QueuedRequest{
		ID: req.ID, TunnelID: t.id, ArrivedAt: req.ArrivedAt, Method: req.Method, URI: req.URI, Headers: head, Body: req.Body,
	})
	t.mu.Lock()
	t.storing--
	t.mu.Unlock()
	if err != nil {
		t.mu.Lock()
		t.queued--
		t.queuedBytes -= size
		t.mu.Unlock()
		if errors.Is(err, ErrQueueFull) {
			w.Header().Set("Retry-After", "60")
			log.Warn("offline queue full", "max_count", s.cfg.QueueMaxCount)
			s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeQueueFull, "the offline queue of this tunnel is full; retry later"))
			return
		}
		log.Error("enqueue", "err", err)
		w.Header().Set("Retry-After", "30")
		if errors.Is(err, ErrMaybeStored) {
			// Retracted in the background, but a drain may read it
			// first: the sender's retry is then a duplicate.
			s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeOutcomeUnknown, "the relay could not confirm that it stored the request: it may still be delivered; retry (the agent marks a repeat as a duplicate)"))
			return
		}
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the request could not be stored; retry later"))
		return
	}
	select {
	case t.kick <- struct{}{}:
	default:
	}
	if s.shared && !t.held() {
		// The stream counts what is queued, and the node holding the
		// agent drains it: a count kept here would only ever rise, and
		// refuse requests the stream has room for.
		t.countOut()
		// The agent may be on another node already: this node's mirror
		// of the holders lags, and the agent may have arrived while this
		// was stored. Its node must count this request before the 202
		// goes, or a live request its sender sends after the 202 may
		// reach the handler first (chaos run, team seed 3301). Kick
		// reads the holder after the store, and the node taking a
		// tunnel counts its queue after its hold is stored (takeTunnel):
		// either Kick's read finds the hold and the holder counts at
		// Kick's word, or the read came before the hold, so the store
		// did too, and the holder's own count finds the request.
		if err := s.cfg.Cluster.Kick(context.WithoutCancel(ctx), t.id); err != nil {
			log.Warn("could not tell the node holding the agent that its queue grew; answering 202 all the same", "err", err)
		}
	}
	log.Info("queued for offline agent", "method", req.Method, "uri", req.URI)
	s.answerQueued(w, req.ID, "queued: the agent is offline; the request will be delivered when it reconnects")
}

// answerQueued tells a sender its request is kept and will be delivered
// later: 202 with the request's id.
func (s *Server) answerQueued(w http.ResponseWriter, id, message string) {
	s.metrics.countStatus(http.StatusAccepted)
	api.WriteData(w, http.StatusAccepted, message, map[string]any{"id": id, "queued": true, "status": "queued"})
}

func (s *Server) expireQueued(ctx context.Context) {
	if n, err := s.cfg.Store.ExpireQueued(ctx, time.Now().Add(-s.cfg.QueueMaxAge)); err != nil {
		s.log.Error("expire queue", "err", err)
	} else if n > 0 {
		s.log.Warn("dropped expired queued requests", "count", n, "max_age", s.cfg.QueueMaxAge)
		s.resyncQueueCounts(ctx)
	}
}

// drainWindow bounds queued requests sent but not yet acknowledged.
const drainWindow = 32

// How long drainLoop waits before reading a queue it could not read.
const (
	readRetryMin = 250 * time.Millisecond
	readRetryMax = 5 * time.Second
)

// dequeueAcked removes the queued requests the agent acknowledged from the
// queue: first and all others acknowledged meanwhile, in one transaction (a
// commit per request would bound the drain by the commit rate), and only
// then counts them out and opens the window for more. drainLoop calls it whenever it waits.
func (ac *agentConn) dequeueAcked(first int64) {
	seqs := []int64{first}
	for {
		select {
		case seq := <-ac.acked:
			seqs = append(seqs, seq)
			continue
		default:
		}
		break
	}
	ac.dequeue(seqs)
}

// flushAcked removes what was acknowledged before the connection closed.
func (ac *agentConn) flushAcked() {
	select {
	case seq := <-ac.acked:
		ac.dequeueAcked(seq)
	default:
	}
}

// dequeue deletes what the agent saved (handleAck counted it out already).
// One that cannot be deleted stays queued and reaches the agent again
// later, which knows it by its id.
func (ac *agentConn) dequeue(seqs []int64) {
	if err := ac.srv.cfg.Store.Dequeue(context.Background(), seqs...); err != nil {
		ac.srv.log.Error("dequeue", "tunnel", ac.t.id, "err", err)
	}
	t := ac.t
	t.mu.Lock()
	left := t.queued
	t.mu.Unlock()
	for range seqs {
		<-ac.window
	}
	if left == 0 {
		ac.TrySend(frameconn.Frame{Head: wire.AppendNotice(nil, wire.Notice{Rejected: t.rejected.Load()})})
	}
}

// drainLoop delivers the tunnel's offline queue in arrival order, keeping
// at most drainWindow requests unacknowledged, and removes from the queue
// what the agent acknowledged.
func (ac *agentConn) drainLoop() {
	t := ac.t
	var after int64 // the sequence of the last request read from the queue
	retry := readRetryMin
	for {
		batch, err := ac.srv.cfg.Store.QueuedAfter(context.Background(), t.id, after, drainWindow)
		var more bool
		switch {
		case err != nil:
			// The store is away for a moment (all of NATS, in a cluster):
			// the agent stays, its live requests keep flowing while
			// nothing is queued, and the drain resumes where it was.
			ac.srv.log.Error("read queue; trying again", "tunnel", t.id, "in", retry, "err", err)
			retry, more = ac.waitToRetry(retry)
		case len(batch) == 0:
			retry = readRetryMin
			more = ac.park()
		default:
			retry = readRetryMin
			after, more = ac.sendQueued(batch, after)
		}
		if !more {
			return
		}
	}
}

// waitToRetry waits retry after a failed read of the queue, removing what
// the agent acknowledges meanwhile. It returns the next wait (doubled when
// this one ran out) and false once the connection has closed.
func (ac *agentConn) waitToRetry(retry time.Duration) (time.Duration, bool) {
	wait := time.NewTimer(retry)
	defer wait.Stop()
	select {
	case <-wait.C:
		return min(2*retry, readRetryMax), true
	case seq := <-ac.acked:
		ac.dequeueAcked(seq)
		return retry, true
	case <-ac.Done():
		ac.flushAcked()
		return retry, false
	}
}

// park waits while the queue is empty until a request is queued (kick),
// the agent acknowledges one, or the connection closes (false).
func (ac *agentConn) park() bool {
	t := ac.t
	// An idle tunnel parks here without timers: thousands of them must
	// cost nothing. Only a place reserved by an insert that had not
	// committed when we looked needs a second look soon.
	t.mu.Lock()
	reserved := t.queued > 0
	t.mu.Unlock()
	var retry <-chan time.Time
	if reserved {
		retry = time.After(50 * time.Millisecond)
	}
	select {
	case <-t.kick:
	case <-retry:
		ac.srv.recount(context.Background(), t)
	case seq := <-ac.acked:
		ac.dequeueAcked(seq)
	case <-ac.Done():
		ac.flushAcked()
		return false
	}
	return true
}

// sendQueued sends the agent batch, read from the queue after the
// sequence after, each request once there is room in the window and no
// orphan of a frozen agent before it, but the copies of orphans it
// answered (frozen.go). It
// returns the sequence of the last one read, and false once the drain is
// over: the connection closed, or the agent is leaving.
func (ac *agentConn) sendQueued(batch []*relaystate.QueuedRequest, after int64) (int64, bool) {
	for _, q := range batch {
		if !ac.awaitOrphans() {
			return after, false
		}
		if ac.skipAnswered(q) {
			after = q.Seq
			continue
		}
		if !ac.waitForRoom() {
			return after, false
		}
		if !ac.sendOneQueued(q) {
			return after, false
		}
		after = q.Seq
	}
	return after, true
}

// waitForRoom takes a place in the window of unacknowledged requests,
// removing what the agent acknowledges meanwhile; false once the
// connection has closed.
func (ac *agentConn) waitForRoom() bool {
	for {
		select {
		case ac.window <- struct{}{}:
			return true
		case seq := <-ac.acked:
			ac.dequeueAcked(seq)
		case <-ac.Done():
			ac.flushAcked()
			return false
		}
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

// sendOneQueued sends the agent q, holding a place in the window; false
// once the drain is over. A request that cannot be read is dropped; one
// larger than this agent reads stays queued.
func (ac *agentConn) sendOneQueued(q *relaystate.QueuedRequest) bool {
	t := ac.t
	hdr, err := wire.DecodeHeader(q.Headers)
	if err != nil {
		ac.srv.log.Error("queued request unreadable; dropping", "tunnel", t.id, "id", q.ID, "err", err)
		ac.srv.cfg.Store.Dequeue(context.Background(), q.Seq)
		t.countOut()
		<-ac.window
		return true
	}
	req := &wire.Request{Stream: ac.nextStream.Add(1), Queued: true, ArrivedAt: q.ArrivedAt, ID: q.ID, Method: q.Method, URI: q.URI, Header: hdr}
	if !ac.admit() {
		// The agent is stopping: what it was not sent stays
		// queued; acks of what it was sent still come.
		<-ac.window
		ac.awaitClose()
		return false
	}
	ac.mu.Lock()
	ac.queued[req.Stream] = q.Seq
	ac.mu.Unlock()
	err = ac.Send(frameconn.Frame{Head: wire.AppendRequestHead(nil, req), Body: q.Body}, nil)
	ac.admitted()
	if errors.Is(err, wire.ErrFrameTooLarge) {
		// This agent reads smaller frames than the relay took: the
		// request stays queued, for an agent that reads it, rather
		// than stalling every request behind it.
		ac.srv.log.Warn("queued request larger than the agent reads; kept for another agent", "tunnel", t.id, "id", q.ID, "bytes", len(q.Body))
		ac.mu.Lock()
		delete(ac.queued, req.Stream)
		ac.mu.Unlock()
		<-ac.window
		return true
	}
	if err != nil {
		ac.flushAcked()
		return false
	}
	return true
}

// awaitClose removes from the queue what a leaving agent acknowledges,
// until its connection closes.
func (ac *agentConn) awaitClose() {
	for {
		select {
		case seq := <-ac.acked:
			ac.dequeueAcked(seq)
		case <-ac.Done():
			ac.flushAcked()
			return
		}
	}
}

// countOut takes one request off t's count of queued requests: the agent
// saved it, or it was dropped.
func (t *tunnel) countOut() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.queued--; t.queued <= 0 {
		t.queued, t.queuedBytes = 0, 0
	}
}

// recount sets, in a cluster, a tunnel's count of queued requests from the
// shared queue, its one source of truth, adding this node's inserts still
// under way: when the agent connects here, when another node queued a
// request for it (kicked), and when the drain finds the queue empty. A
// count only ever raised would queue every live request for good once the
// stream had drained; one lowered below the stream's would let a live
// request pass a queued one. The stream counts a request delivered but not
// yet deleted: too high for a moment, which only makes a live request wait.
func (s *Server) recount(ctx context.Context, t *tunnel) {
	if !s.shared {
		return // one node counts exactly
	}
	// Counts are written in the order they were read: one read before a
	// request was stored must not overwrite one read after (a kick's).
	t.recounting.Lock()
	defer t.recounting.Unlock()
	st, err := s.cfg.Store.TunnelQueueStats(ctx, t.id)
	if err != nil {
		return
	}
	t.mu.Lock()
	t.queued, t.queuedBytes = st.Count+t.storing, st.Bytes
	t.mu.Unlock()
}
