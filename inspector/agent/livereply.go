package agent

import (
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/storage/agentdb"
)

// liveReply settles the answer to a live request that commits through
// writeLoop (serveLive). Its forward goroutine has the handler's answer,
// writeLoop the commit's outcome; whichever is done second sends the
// relay its answer. Under load that is mostly writeLoop (a commit waits
// for the disk; a handler on loopback answers sooner), which sends the
// answers of its whole commit in one write (sendReplies), where each
// goroutine would make a write of its own and be woken to make it.
//
// The ack the relay needs only from a slow handler (the answer of a live
// request tells the relay it was saved) is timed from the commit, and only
// if the handler has not answered by then.
type liveReply struct {
	s     *relay.Stream
	c     *agentdb.Capture
	state atomic.Int32 // replyWaiting, then one of the others, once
	res   sendResult   // the handler's answer: written by the goroutine before it moves state
	err   error        // the commit's outcome: written by writeLoop before it moves state
	ack   *time.Timer  // written by writeLoop before it moves state
}

const (
	replyWaiting   int32 = iota
	replyAnswered        // the handler answered first: writeLoop sends the reply
	replyCommitted       // the commit ended first: the goroutine sends it
	replyGivenUp         // never forwarded (the agent is stopping): answered not saved at once
)

// answered is the forward goroutine's half.
func (lr *liveReply) answered(a *Agent, res sendResult) {
	lr.res = res
	if lr.state.CompareAndSwap(replyWaiting, replyAnswered) {
		return
	}
	if lr.ack != nil {
		lr.ack.Stop()
	}
	lr.s.Respond(lr.response(a))
	lr.s.Release()
}

// committed is writeLoop's half (or that of whoever ends a write that was
// never made): err is the commit's outcome.
func (lr *liveReply) committed(a *Agent, err error) {
	lr.err = err
	if err == nil && lr.state.Load() == replyWaiting {
		lr.ack = time.AfterFunc(liveAckDelay, lr.s.Ack)
	}
	if lr.state.CompareAndSwap(replyWaiting, replyCommitted) {
		return
	}
	if lr.ack != nil {
		lr.ack.Stop()
	}
	if lr.state.Load() == replyAnswered {
		a.replyMu.Lock()
		a.replies = append(a.replies, lr)
		a.replyMu.Unlock()
	}
}

// giveUp answers a request that will not be forwarded: not saved, so
// that its sender sends it again, whatever becomes of its commit.
func (lr *liveReply) giveUp() {
	if !lr.state.CompareAndSwap(replyWaiting, replyGivenUp) && lr.ack != nil {
		lr.ack.Stop() // committed first: nothing else moves it
	}
	lr.s.Respond(refusal(errStopped))
	lr.s.Release()
}

// response is the answer the relay gets: the handler's, once recorded, or
// a refusal naming why it was not saved and that the handler may have
// seen the request (the forward is over); its sender sends it again, and
// that one is saved.
func (lr *liveReply) response(a *Agent) *relay.Response {
	if lr.err != nil {
		return refusalAfterForward(lr.err)
	}
	return a.record(lr.c, 1, lr.res)
}

// sendReplies sends the replies that fell to writeLoop's side, together.
// Whoever ends writes calls it after their afters have run.
func (a *Agent) sendReplies() {
	a.replyMu.Lock()
	lrs := a.replies
	a.replies = nil
	a.replyMu.Unlock()
	if len(lrs) == 0 {
		return
	}
	ss := make([]*relay.Stream, len(lrs))
	rs := make([]*relay.Response, len(lrs))
	for i, lr := range lrs {
		ss[i], rs[i] = lr.s, lr.response(a)
	}
	relay.RespondAll(ss, rs)
	for _, lr := range lrs {
		lr.s.Release()
	}
}
