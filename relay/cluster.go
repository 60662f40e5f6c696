// Several relay nodes as one: a request that lands on a node other than
// the one holding its tunnel's agent is handed to that node, and queues
// kept by any node drain through whichever node the agent reaches.

package relay

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
)

// serveClustered runs Cluster.Serve until ctx ends.
func (s *Server) serveClustered(ctx context.Context) error {
	return s.cfg.Cluster.Serve(ctx, NodeHandlers{Forward: s.serveForwarded, Kicked: s.kicked, TakenOver: s.takenOver, Revoked: s.dropTunnel, Regained: s.regained})
}

// regained counts again the queue of every tunnel held here, from the
// shared queue, and wakes its drain: while this node's lease had lapsed,
// other nodes queued its tunnels' requests, and the kicks they sent were
// lost. Live requests wait behind what the count finds.
func (s *Server) regained() {
	for _, t := range s.snapshotTunnels() {
		if t.held() {
			s.recountAndWake(t)
		}
	}
}

// remoteHolder returns the other node that holds t's agent, or "".
func (s *Server) remoteHolder(t *tunnel) string {
	n := s.cfg.Cluster.Holder(t.id).Node
	if n == s.cfg.Cluster.Self() {
		return ""
	}
	return n
}

// requiredHeaders are what senders of t must present: what the agent asked
// for on connecting to this node, or, in a cluster with no agent here, to
// whichever node it reached last.
func (s *Server) requiredHeaders(t *tunnel) []wire.HeaderField {
	t.mu.Lock()
	require, here := t.require, t.agent != nil
	t.mu.Unlock()
	if here || !s.shared {
		return require
	}
	return s.cfg.Cluster.Holder(t.id).Require
}

// forwardToNode hands a request to the node holding its agent and relays
// that node's answer. A node that is gone leaves the request to the
// shared queue, which any node drains.
func (s *Server) forwardToNode(w http.ResponseWriter, r *http.Request, t *tunnel, node string, req *wire.Request, log reqLogger) {
	// The holding node answers within its forward timeout; the margin is
	// for the hop.
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ForwardTimeout+5*time.Second)
	defer cancel()
	defer context.AfterFunc(s.abandon, cancel)()
	s.metrics.crossOut.Add(1)
	a, err := s.cfg.Cluster.Forward(ctx, node, t.id, req)
	switch {
	case err != nil && r.Context().Err() == nil && s.abandon.Err() != nil:
		s.refuseStopping(w)
		return
	case errors.Is(err, ErrNodeGone):
		log.Warn("node holding the agent is gone; queueing", "node", node)
		s.enqueue(w, r.Context(), t, req, log)
		return
	case r.Context().Err() != nil:
		return
	case errors.Is(err, context.DeadlineExceeded):
		// It may have taken the request, and be at it still.
		w.Header().Set("Retry-After", "5")
		s.fail(w, api.Errorf(http.StatusGatewayTimeout, api.CodeOutcomeUnknown, "the relay node holding the agent did not answer within %s: the request may have reached the local handler; retry (the agent marks a repeat as a duplicate)", s.cfg.ForwardTimeout+5*time.Second))
		return
	case errors.Is(err, ErrAnswerLost):
		log.Warn("forward to node", "node", node, "err", err)
		w.Header().Set("Retry-After", "5")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeOutcomeUnknown, "the relay node holding the agent took the request, but its answer was lost: it may have reached the local handler; retry (the agent marks a repeat as a duplicate)"))
		return
	case err != nil:
		// The holding node never took it, and never will (NodeHandlers):
		// the request reaches the handler only through this retry.
		log.Warn("forward to node", "node", node, "err", err)
		w.Header().Set("Retry-After", "5")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay node holding the agent could not be reached; the request did not reach the local handler; retry"))
		return
	}
	s.writeAnswer(w, a.Status, a.Header, a.Body)
}

// serveForwarded answers a request another node took for a tunnel whose
// agent is here: live, or queued when the agent has left or is draining,
// exactly as if its sender had come here. It never forwards again.
func (s *Server) serveForwarded(ctx context.Context, tunnelID string, req *wire.Request, takeBy time.Time) *wire.Answer {
	s.metrics.crossIn.Add(1)
	s.busy.Add(1)
	defer s.busy.Add(-1)
	// ctx ends when this node stops taking requests from the others; one
	// taken already is answered, within the stop grace (Serve).
	ctx = context.WithoutCancel(ctx)
	rec := &answerWriter{header: http.Header{}, body: &bytes.Buffer{}}
	t, err := s.lookupTunnel(ctx, tunnelID)
	switch {
	case err != nil:
		rec.Header().Set("Retry-After", "5")
		api.WriteError(rec, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay could not read its tokens; retry"))
	case t == nil:
		api.WriteError(rec, api.NotFound("tunnel"))
	default:
		select {
		case t.inflight <- struct{}{}:
			s.take(rec, ctx, t, req, takeBy)
			<-t.inflight
		default:
			rec.Header().Set("Retry-After", "1")
			api.WriteError(rec, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "too many requests in flight for this tunnel"))
		}
	}
	return rec.answer()
}

// take delivers or queues a forwarded request, if its sender's node still
// waits for it (takeBy).
func (s *Server) take(w http.ResponseWriter, ctx context.Context, t *tunnel, req *wire.Request, takeBy time.Time) {
	log := reqLogger{s.log, t.id, req.ID}
	if !takeBy.IsZero() && !time.Now().Before(takeBy) {
		// Delivered or queued now, it would reach the handler behind the
		// sender's back: its node may have told it to retry already.
		log.Warn("a request from another node came too late to take; its sender retries", "late", time.Since(takeBy).Round(time.Millisecond))
		w.Header().Set("Retry-After", "1")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay node holding the agent could not take the request in time; it did not reach the local handler; retry"))
		return
	}
	s.forwardOrQueue(w, ctx, t, req, nil, log)
}

// kicked wakes the drain of a tunnel held here whose queue another node
// added to, and makes live requests wait behind what was queued.
func (s *Server) kicked(tunnelID string) {
	s.mu.Lock()
	t := s.tunnels[tunnelID]
	s.mu.Unlock()
	if t == nil || !t.counts() {
		// Only the node holding the agent counts a tunnel's queue (it
		// drains it); elsewhere the count would never come down again.
		return
	}
	s.recountAndWake(t)
}

// recountAndWake counts t's queue again from the shared queue, so that
// live requests wait behind what other nodes queued, and wakes its drain.
func (s *Server) recountAndWake(t *tunnel) {
	s.recount(context.Background(), t)
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// takenOver sends away this node's agent of a tunnel another node now
// holds: the same token connected there, and the newest agent wins, as on
// one node.
func (s *Server) takenOver(tunnelID string) {
	s.sendAway(tunnelID, false, wire.GoAway{Reason: wire.GoAwayReplaced, Message: "another agent connected with the same token to another relay node and took over this tunnel"})
}

// ErrorAnswer is e as a node answers it: the error envelope, with e's status.
func ErrorAnswer(e *api.Error) *wire.Answer {
	rec := &answerWriter{header: http.Header{}, body: &bytes.Buffer{}}
	api.WriteError(rec, e)
	return rec.answer()
}

func (a *answerWriter) answer() *wire.Answer {
	if a.status == 0 {
		// Nothing was written: no handler answered, and neither did the
		// relay. The sender retries; a 200 would tell it a handler had.
		a.header = http.Header{"Retry-After": {"2"}}
		a.body.Reset()
		api.WriteError(a, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay node holding the agent gave no answer; retry"))
	}
	return &wire.Answer{Status: a.status, Header: wire.HeaderFrom(a.header, ""), Body: a.body.Bytes()}
}

// answerWriter records what the local path answers a forwarded request.
type answerWriter struct {
	header http.Header
	status int
	body   *bytes.Buffer
}

func (a *answerWriter) Header() http.Header { return a.header }

func (a *answerWriter) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
}

func (a *answerWriter) Write(b []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.body.Write(b)
}
