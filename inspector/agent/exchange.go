package agent

import (
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// An exchange is one tunnel request in the agent, from ServeTunnel until
// the relay has all it will get of it. finish ends it: it alone answers
// the relay and gives the request's buffer back; ackAll and finishAll are
// its batched forms, which the committer uses so that a commit's acks, and
// the answers that fall to it, leave in one write each; ackLater is the
// ack a slow handler's request gets. Nothing else in the package writes to
// the relay.
type exchange struct {
	s         *tunnel.Stream   // set by ServeTunnel, then read-only; nil for a queued request an earlier run saved
	c         *agentdb.Capture // set by ServeTunnel; the committer's from its write's queueing until its after runs
	h         wire.Header      // set by ServeTunnel, then read-only
	plan      plan             // chosen by ServeTunnel (choose), then read-only
	arrivedAt time.Time        // set by ServeTunnel, then read-only
	route     string           // the route it took: its lane; set by ServeTunnel (or resume), then read-only

	// state is where the exchange stands: xWaiting, until one of the
	// goroutines below moves it, once, by CompareAndSwap, to one of the
	// other states; whoever moves it knows who finishes the exchange (see
	// the states). Only alongside and in-turn exchanges use it.
	state atomic.Int32

	res       sendResult     // the handler's answer: written by the sending goroutine before it moves state or finishes
	forwarded bool           // the request was, or may have been, written to the handler: written with res
	err       error          // the save's outcome: written by the write's after before it moves state or closes saved
	ack       *time.Timer    // the slow handler's ack (alongside): written by the write's after before it moves state
	resp      *wire.Response // xAnswered: the answer finishAll sends, written by the write's after before it hands x to the committer

	// In the turn line (in turn, queued) and save first.
	saved    chan struct{} // closed once the save is over: err, id and skip are set
	id       string        // the capture's id: the one made for it, then, once saved is closed, the store's
	skip     bool          // a queued request the relay sent again: its first copy has the turn
	timer    *time.Timer   // in turn: defers it before the relay's forward timeout runs out; set before it joins the line
	answered chan struct{} // in turn: closed once a deferred one has its answer
	queued   bool          // in turn: a deferred one was answered "queued"; set before answered is closed
}

// The states of an exchange. Each moves from xWaiting once:
//
//	xWaiting -> xAnswered   alongside: the handler answered before the commit ended; the committer finishes it (finishAll)
//	xWaiting -> xCommitted  alongside: the commit ended first; the sending goroutine finishes it
//	xWaiting -> xSending    in turn: turnLoop took it to the handler and finishes it
//	xWaiting -> xDeferred   in turn: its wait would outlast the relay's timeout, or the agent drains; answered "queued"
const (
	xWaiting int32 = iota
	xAnswered
	xCommitted
	xSending
	xDeferred
)

// finish ends x: the relay gets r, the answer to a live request (nil for a
// queued one, acknowledged by its commit's ackAll), and the request's
// buffer goes back: from now on its body is read back from the store.
func (x *exchange) finish(r *wire.Response) {
	if x.ack != nil {
		x.ack.Stop()
	}
	if r != nil {
		x.s.Respond(r)
	}
	x.s.Release()
}

// liveAckDelay is how long a live request's ack waits for the answer that
// makes it unneeded.
const liveAckDelay = 2 * time.Millisecond

// ackLater acknowledges x, saved, to the relay after liveAckDelay, unless
// the timer it returns is stopped first: the relay needs the ack only from
// a slow handler (a live request's answer tells it the request was saved).
func (x *exchange) ackLater() *time.Timer { return time.AfterFunc(liveAckDelay, x.s.Ack) }

// ackAll acknowledges, in one write, the saved requests of a commit that
// wait for it (queued and in-turn ones).
func ackAll(xs []*exchange) {
	if len(xs) == 0 {
		return
	}
	ss := make([]*tunnel.Stream, len(xs))
	for i, x := range xs {
		ss[i] = x.s
	}
	tunnel.AckAll(ss)
}

// finishAll finishes, in one write, the alongside exchanges whose answers
// fell to the committer, each with its response.
func finishAll(xs []*exchange) {
	if len(xs) == 0 {
		return
	}
	ss := make([]*tunnel.Stream, len(xs))
	rs := make([]*wire.Response, len(xs))
	for i, x := range xs {
		ss[i], rs[i] = x.s, x.resp
	}
	tunnel.RespondAll(ss, rs)
	for _, x := range xs {
		x.s.Release()
	}
}

// plan is how a tunnel request is served: choose picks it, serve runs it.
// The order matters: from planSaveFirst on, an exchange waits for its save
// on saved; from planInTurn on, it has a place in the turn line.
type plan uint8

const (
	// planAlone: a live request alone in the tunnel, served all on one
	// goroutine (sendAlone). One request at a time is how a voice service
	// calls, and there the committer's batching has nothing to gather,
	// while the hand-offs to loop and back each wake a thread on the other
	// core: at c=1 they were half the agent's futex calls.
	planAlone plan = iota
	// planAlongside: a live request while others are in flight: sent on a
	// goroutine of its own while loop commits it with the others; whichever
	// ends second answers it (sendAlongside, committed).
	planAlongside
	// planSaveFirst: a live request while commits fail: committed, then
	// sent, or refused before the handler (sendSaved).
	planSaveFirst
	// planStored: a live request its route stores only: committed, then
	// answered by the agent itself, never sent (answerStored).
	planStored
	// planInTurn: a live request that arrives while requests before it wait
	// for the handler: saved and acknowledged at once, sent by turnLoop in
	// its turn, and answered "queued" should its wait outlast the relay's
	// forward timeout (deferTurn).
	planInTurn
	// planQueued: a request from the relay's offline queue (or one an
	// earlier run saved and did not send): saved and acknowledged in
	// arrival order, sent by turnLoop in its turn.
	planQueued
)
