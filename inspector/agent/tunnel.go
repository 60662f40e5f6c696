package agent

import (
	"context"
	"strings"
	"time"

	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// ServeTunnel takes a request from the relay. It runs on the connection's
// read loop, so it does little I/O of its own: it reads the body for the
// call event's fields and its route (newCapture; with a route file whose
// match a call's later event lacks, that is once per call a read of the
// store, for what the call's events before a restart had: CallMemory),
// picks a plan, and starts the request's goroutine or queues it, on its
// route's turn line and in the committer's write queue. That queue is
// bounded (1024 writes): when it is full, ServeTunnel
// blocks until the committer takes from it, and so the read loop stops
// reading, which holds the relay to the agent's pace (the relay keeps what
// it cannot send in its queue).
//
// A live request is forwarded while its capture is committed, and the relay
// gets the handler's answer once both are done: the sender's answer means
// the capture is saved (a capture that fails to commit turns the answer
// into a 503 naming the cause, coded outcome_unknown since the handler may
// have the request, and the sender retries), and the handler does not wait
// for the commit. So the handler may see a request whose capture a crash
// then loses; its sender, given no answer, sends it again, with the same
// delivery id. While commits fail, a live request is committed first and
// refused before the handler if that fails (planSaveFirst). A queued
// request is saved and acknowledged, then forwarded in arrival order
// (turnLoop); so is a live request that arrives while any request before
// it still waits for the handler (planInTurn).
func (a *Agent) ServeTunnel(req *wire.Request, s *tunnel.Stream) {
	if req.Queued && a.liveSaved.has(req.ID) {
		// A copy the relay queued of a live request saved here already
		// (livecopy.go): saved, and handed to the handler once.
		a.log.Debug("the relay's queued copy of a request saved live already; acknowledged, not sent again", "relay_id", req.ID)
		s.Ack()
		s.Release()
		return
	}
	c := a.newCapture(SourceTunnel, req.Method, req.URI, req.Header, req.Body)
	c.RelayID = req.ID
	x := &exchange{s: s, c: c, h: req.Header, id: c.ID, arrivedAt: time.UnixMicro(req.ArrivedAt).UTC(), route: c.Route}
	x.plan = a.choose(req.Queued, c)
	a.serve(x)
}

// choose picks a request's plan from the committer's state and the turn
// line's. A live request served alone or alongside is counted in cm.live
// until it is answered.
func (a *Agent) choose(queued bool, c *agentdb.Capture) plan {
	switch {
	case queued:
		return planQueued
	case c.Status == agentdb.StatusStored:
		return planStored
	case a.laneFor(c.Route).waiting.Load() > 0:
		return planInTurn
	case a.cm.savesFailing():
		return planSaveFirst
	case a.cm.live.Add(1) == 1 && !agentdb.KeptApart(len(c.Body)) && !strings.HasPrefix(c.Target, "https:"):
		// Large bodies are staged on goroutines of their own, and an
		// https target's client writes no "sent" signal to commit on.
		return planAlone
	default:
		return planAlongside
	}
}

// serve runs x's plan in three steps: its place (the turn line, in arrival
// order, however long the save takes; or a goroutine of its own that sends
// it), its save (inline by that goroutine when alone, else by the
// committer), and, in turn, an early answer if no turn comes in this run.
func (a *Agent) serve(x *exchange) {
	if x.plan >= planSaveFirst {
		x.saved = make(chan struct{})
	}
	if x.plan >= planInTurn {
		a.lineUp(x)
	} else if !a.start(func() { a.sendLive(x) }) { // the goroutine ends within the forward timeout
		a.refuseStopping(x)
		return
	}
	if x.plan != planAlone {
		a.write(x)
	}
	if x.plan == planInTurn && a.isDraining() {
		a.deferLater(x) // no turn comes in this run
	}
}

// refuseStopping answers a live request the stopping agent will not send.
func (a *Agent) refuseStopping(x *exchange) {
	if x.plan <= planAlongside {
		a.cm.live.Add(-1)
	}
	x.finish(refusal(errStopped))
}

// write has the committer save x's capture; its after tells x the outcome.
func (a *Agent) write(x *exchange) {
	op := writeOp{insert: x.c, after: x.saveEnded}
	switch x.plan {
	case planAlongside:
		op.after = func(err error) { a.committed(x, err) }
	case planInTurn:
		op.ack = x // its answer may be a while: the relay learns it is saved
	case planQueued:
		// The relay forgets a queued request once it is saved. It goes to
		// the queue at once, large body or not, so that commits (and acks)
		// keep the order of arrival; and is kept until it commits.
		x.c.Queued, x.c.ArrivedAt = true, x.arrivedAt
		op.ack, op.keep, op.after = x, true, x.queuedSaveEnded
		a.cm.queueOrEnd(op)
		return
	}
	if !agentdb.KeptApart(len(x.c.Body)) {
		a.cm.queueOrEnd(op)
		return
	}
	// A large body is written to its file here, beside the others (loop
	// would write them one at a time, each waiting for the device), and
	// the capture queued once it is; its place in the store's order is
	// then when it was written. Should this fail, WriteCaptures tries
	// again.
	staged := a.start(func() {
		if err := a.store.StageBody(x.c); err != nil {
			a.log.Warn("writing a large body", "err", err)
		}
		a.cm.queueOrEnd(op)
	})
	if !staged {
		op.after(errStopped)
		a.cm.sendReplies()
	}
}

// saveEnded is the after of the write of an exchange that waits for its
// save on saved.
func (x *exchange) saveEnded(err error) {
	x.id, x.err = x.c.ID, err
	close(x.saved)
}

// queuedSaveEnded is saveEnded for a queued request: acknowledged already
// (ackAll) if saved, it is finished, its body read back from the store
// when its turn comes. The relay sent it again if our ack was lost: the
// first copy (whose id the store gave back) has its turn. A save tried
// again may find its own first try, committed after all: that one keeps
// its id, and its turn.
func (x *exchange) queuedSaveEnded(err error) {
	x.finish(nil)
	x.skip = x.c.ID != x.id
	x.saveEnded(err)
}

// sendLive sends a live request served alone, alongside or save first, on
// its own goroutine, and answers it.
func (a *Agent) sendLive(x *exchange) {
	switch x.plan {
	case planAlone:
		a.sendAlone(x)
	case planAlongside:
		a.sendAlongside(x)
	case planStored:
		a.answerStored(x)
	default:
		a.sendSaved(x, true)
	}
}

// sendAlone serves a request alone in the tunnel: it writes the request
// to the handler, commits the capture inline while the handler works, then
// reads the answer, which is often there already.
//
// Unlike an alongside one it sends no ack ahead of a slow handler's answer
// (that would take a timer per request): should the agent vanish while
// the handler works, the relay tells the sender it is unsure the request
// was saved, and the sender sends it again, as it would have anyway.
func (a *Agent) sendAlone(x *exchange) {
	committed := false
	commit := func() {
		if !committed {
			committed = true
			x.err = a.cm.commitInline(x.c)
		}
	}
	x.res = a.send(context.Background(), x.c, x.h, x.s.Limits(), commit)
	x.forwarded = committed // send commits once the request is written to the handler
	commit()                // done already, unless the request never reached the handler: saved all the same, with its failure
	a.cm.live.Add(-1)
	x.finish(a.response(x))
}

// sendAlongside sends a request whose capture the committer commits
// meanwhile: whichever of the two ends second answers the relay (see
// committed). Under load that is mostly the committer (a commit waits for
// the disk; a handler on loopback answers sooner), which sends the answers
// of its whole commit in one write (finishAll), where each goroutine would
// make a write of its own and be woken to make it.
func (a *Agent) sendAlongside(x *exchange) {
	x.forwarded = true
	x.res = a.send(context.Background(), x.c, x.h, x.s.Limits(), nil)
	a.cm.live.Add(-1)
	if x.state.CompareAndSwap(xWaiting, xAnswered) {
		return // the committer finishes it
	}
	x.finish(a.response(x))
}

// committed is an alongside request's write's after: err is its save's
// outcome. The ack the relay needs only from a slow handler is timed from
// the commit, and only if the handler has not answered by then.
func (a *Agent) committed(x *exchange, err error) {
	x.err = err
	if err == nil && x.state.Load() == xWaiting {
		x.ack = x.ackLater()
	}
	if x.state.CompareAndSwap(xWaiting, xCommitted) {
		return // the sending goroutine finishes it
	}
	if x.ack != nil {
		x.ack.Stop()
	}
	x.resp = a.response(x)
	a.cm.addReply(x)
}
