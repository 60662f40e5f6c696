package agent

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/storage/agentdb"
)

// ServeTunnel takes a request from the relay. It runs on the connection's
// read loop, so it only queues work.
//
// A live request is forwarded while its capture is committed, and the relay
// gets the handler's answer once both are done: the sender's answer means
// the capture is saved (a capture that fails to commit turns the answer
// into a 503 naming the cause, coded outcome_unknown since the handler may
// have the request, and the sender retries), and the handler does not wait
// for the commit. So the handler may see a request whose
// capture a crash then loses; its sender, given no answer, sends it again,
// with the same delivery id. While commits fail, a live request is
// committed first and refused before the handler if that fails
// (serveSaveFirst). A queued request is saved and acknowledged, then
// forwarded in arrival order (turnLoop); so is a live request that arrives
// while any request before it still waits for the handler (serveInTurn).
func (a *Agent) ServeTunnel(req *relay.Request, s *relay.Stream) {
	c := a.newCapture(SourceTunnel, req.Method, req.URI, req.Header, req.Body)
	c.RelayID = req.ID
	if !req.Queued {
		switch {
		case a.waiting.Load() > 0:
			a.serveInTurn(c, req, s)
		case a.savesFailing():
			a.serveSaveFirst(c, req.Header, s)
		default:
			a.serveLive(c, req.Header, s)
		}
		return
	}
	c.Queued = true
	c.ArrivedAt = time.UnixMicro(req.ArrivedAt).UTC()
	t := &turn{saved: make(chan struct{})}
	a.addTurn(t) // now, so that its place is its arrival, however long the save takes
	id := c.ID
	// The relay forgets a queued request once it is saved. It goes to
	// writeLoop at once, large body or not, so that commits (and acks)
	// keep the order of arrival.
	a.queueInsert(writeOp{insert: c, ack: s, keep: true, after: func(err error) {
		s.Release() // the body is read back from the store
		t.id, t.err = c.ID, err
		// The relay sent it again because our ack was lost: the first
		// copy (whose id the store gave back) has its turn. A save tried
		// again may find its own first try, committed after all: that one
		// keeps its id, and its turn.
		t.skip = c.ID != id
		close(t.saved)
	}})
}

// serveLive saves and forwards a live request side by side; see ServeTunnel.
func (a *Agent) serveLive(c *agentdb.Capture, h relay.Header, s *relay.Stream) {
	if a.live.Add(1) == 1 && !agentdb.KeptApart(len(c.Body)) && !strings.HasPrefix(c.Target, "https:") {
		a.serveAlone(c, h, s)
		return
	}
	lr := &liveReply{s: s, c: c}
	a.insert(writeOp{insert: c, after: func(err error) { lr.committed(a, err) }})
	// The goroutine ends within the forward timeout; writeLoop, or Run's
	// stop, ends every queued write.
	started := a.start(func() {
		res := a.send(context.Background(), c, h, s.Limits(), nil)
		a.live.Add(-1)
		lr.answered(a, res)
	})
	if !started { // the agent is stopping
		a.live.Add(-1)
		lr.giveUp()
	}
}

// serveAlone serves a live request that is alone in the tunnel, all on one
// goroutine: it writes the request to the handler, commits the capture
// while the handler works, then reads the answer, which is often there
// already. One request at a time is how a voice service calls, and
// there writeLoop's batching has nothing to gather, while the hand-offs to
// it and back each wake a thread on the other core (futex, and the woken
// thread's sleep again): at c=1 they were half the agent's futex calls.
// Requests that arrive while one is in flight go through writeLoop, which
// commits them together.
//
// Unlike serveLive it sends no ack ahead of a slow handler's answer (that
// would take a timer per request): should the agent vanish while the
// handler works, the relay tells the sender it is unsure the request was
// saved, and the sender sends it again, as it would have anyway.
func (a *Agent) serveAlone(c *agentdb.Capture, h relay.Header, s *relay.Stream) {
	started := a.start(func() {
		defer s.Release()
		committed := false
		var saveErr error
		commit := func() {
			if !committed {
				committed = true
				saveErr = a.commitAlone(c)
			}
		}
		res := a.send(context.Background(), c, h, s.Limits(), commit)
		forwarded := committed // send calls commit once the request is written to the handler
		commit()               // done already, unless the request never reached the handler: saved all the same, with its failure
		a.live.Add(-1)
		if saveErr != nil && forwarded {
			s.Respond(refusalAfterForward(saveErr)) // the handler may have seen it
			return
		}
		if saveErr != nil {
			s.Respond(refusal(saveErr)) // never written to the handler
			return
		}
		s.Respond(a.record(c, 1, res))
	})
	if !started {
		a.live.Add(-1)
		s.Respond(refusal(errStopped))
		s.Release()
	}
}

// commitAlone commits the capture of a request served alone (serveAlone),
// with the handler's answers waiting to be recorded, as writeLoop commits
// a batch. Run waits for the request's goroutine before it stops writing,
// so the store is still open.
func (a *Agent) commitAlone(c *agentdb.Capture) error {
	a.commitMu.Lock()
	defer a.commitMu.Unlock()
	answers := a.answers.take()
	written, err := a.captures.LogCaptures(context.Background(), []*agentdb.Capture{c}, answers)
	if err != nil {
		a.answers.giveBack(answers)
		a.saveFailed(err)
		a.log.Debug("saving a capture", "err", err)
		return err
	}
	a.committedInsert(c, written[0])
	a.committedResponses(answers)
	return nil
}

// insert queues the insert of a live request's capture; should the agent
// have stopped, op.after is told so at once.
func (a *Agent) insert(op writeOp) {
	c := op.insert
	if agentdb.KeptApart(len(c.Body)) {
		// A large body is written to its file here, beside the others
		// (writeLoop would write them one at a time, each waiting for the
		// device), and the capture queued once it is; its place in the
		// store's order is then when it was written. Should this fail,
		// WriteCaptures tries again.
		staged := a.start(func() {
			if err := a.store.StageBody(c); err != nil {
				a.log.Warn("writing a large body", "err", err)
			}
			a.queueInsert(op)
		})
		if !staged {
			op.after(errStopped)
			a.sendReplies()
		}
		return
	}
	a.queueInsert(op)
}

// queueInsert queues op, or tells op.after why it could not.
func (a *Agent) queueInsert(op writeOp) {
	if err := a.queue(context.Background(), op); err != nil {
		op.after(err)
		a.sendReplies()
	}
}

// liveAckDelay is how long a live request's ack waits for the response
// that makes it unneeded.
const liveAckDelay = 2 * time.Millisecond

// turn is a tunnel request waiting for its turn at the handler.
type turn struct {
	saved chan struct{} // closed once the capture's save is over
	id    string        // the capture's; set before saved is closed
	err   error         // why the save failed; set before saved is closed
	skip  bool          // a queued request sent again: nothing to deliver

	// A live request only (s != nil).
	s         *relay.Stream
	c         *agentdb.Capture // writeLoop's until saved
	h         relay.Header
	arrivedAt time.Time
	state     atomic.Int32  // turnWaiting, then turnSending (turnLoop) or turnDeferred (the timer)
	timer     *time.Timer   // defers it before the relay's forward timeout runs out
	answered  chan struct{} // a deferred one: closed once the relay has its answer
	queued    bool          // a deferred one: answered "queued" (else refused); set before answered is closed
}

// States of a live request's turn.
const (
	turnWaiting int32 = iota
	turnSending
	turnDeferred
)

// closedChan is the saved channel of a capture saved before this run.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// addTurn puts t at the end of the line.
func (a *Agent) addTurn(t *turn) {
	a.waiting.Add(1)
	a.turnMu.Lock()
	a.turns = append(a.turns, t)
	a.turnMu.Unlock()
	select {
	case a.turnWake <- struct{}{}:
	default:
	}
}

// serveInTurn saves a live request at once but sends it to the handler
// only after the requests that arrived before it. Its sender still gets the
// handler's answer, unless the wait would outlast the relay's forward
// timeout: then the agent answers "queued" (the sender gets 202) and
// delivers it later, in its turn, like a queued request.
func (a *Agent) serveInTurn(c *agentdb.Capture, req *relay.Request, s *relay.Stream) {
	t := &turn{saved: make(chan struct{}), s: s, c: c, h: req.Header,
		arrivedAt: time.UnixMicro(req.ArrivedAt).UTC(), answered: make(chan struct{})}
	if ft := s.ForwardTimeout(); ft > 0 {
		t.timer = time.AfterFunc(ft-deferMargin(ft), func() {
			// Its waits end by themselves, so it may run after Run
			// has stopped waiting for tasks.
			if a.enter() {
				defer a.tasks.Done()
			}
			a.deferTurn(t)
		})
	}
	a.addTurn(t)
	a.insert(writeOp{insert: c, after: func(err error) {
		t.id, t.err = c.ID, err
		close(t.saved)
		if err == nil {
			s.Ack() // its answer may be a while: the relay learns it is saved
		}
	}})
	if a.isDraining() {
		a.deferLater(t) // no turn comes in this run
	}
}

// isDraining reports whether Drain was called.
func (a *Agent) isDraining() bool {
	select {
	case <-a.draining:
		return true
	default:
		return false
	}
}

// deferLater answers t "queued" on a goroutine of its own, Run waiting for
// it, since its save may still be under way.
func (a *Agent) deferLater(t *turn) {
	if t.s == nil || t.s.ForwardTimeout() <= 0 {
		return // queued already; or a relay that knows no "queued": it waits
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	if !a.start(func() { a.deferTurn(t) }) {
		go a.deferTurn(t) // the agent is closing: its waits still end by themselves
	}
}

// deferMargin is how long before the relay's forward timeout a live request
// still waiting for its turn is answered "queued": time to commit its
// queued mark behind the writes already in line (a busy queue's answers)
// and for the answer to reach the relay, whose clock started first.
func deferMargin(ft time.Duration) time.Duration { return min(ft/2, 3*time.Second) }

// deferTurn answers a live request still waiting for its turn "queued",
// once it is saved and marked queued, so that a restart before its turn still
// sends it (UndeliveredQueued).
func (a *Agent) deferTurn(t *turn) {
	if !t.state.CompareAndSwap(turnWaiting, turnDeferred) {
		return // turnLoop took it
	}
	defer close(t.answered)
	defer t.s.Release() // from now on the body is read back from the store
	<-t.saved           // comes: every queued write is told its outcome
	if t.err != nil {
		t.s.Respond(refusal(t.err))
		return
	}
	kept := *t.c
	kept.Queued, kept.ArrivedAt = true, t.arrivedAt
	if err := a.save(context.Background(), writeOp{update: &kept, keep: true}); err != nil {
		t.s.Respond(refusal(err)) // the agent is stopping
		return
	}
	t.queued = true
	t.s.Respond(&relay.Response{Result: relay.ResultQueued})
}

// turnLoop sends the tunnel's requests that must wait for their turn to the
// handler, one at a time, in arrival order, until the agent drains: then
// the turn at the handler finishes, and the live requests still waiting
// are answered "queued" (deferLater), to be sent with the queued ones, in
// their order, by the next run (UndeliveredQueued).
func (a *Agent) turnLoop(ctx context.Context) {
	// A turn taken runs to its end: a request at the handler whose answer
	// is not recorded would be sent again by the next run.
	run := context.WithoutCancel(ctx)
	for {
		if a.isDraining() {
			a.turnMu.Lock()
			left := a.turns
			a.turns = nil
			a.turnMu.Unlock()
			for _, t := range left {
				a.deferLater(t)
			}
			return
		}
		a.turnMu.Lock()
		var t *turn
		if len(a.turns) > 0 {
			t = a.turns[0]
			a.turns[0] = nil
			a.turns = a.turns[1:]
		}
		a.turnMu.Unlock()
		if t == nil {
			select {
			case <-a.turnWake:
			case <-a.draining:
			}
			continue
		}
		a.takeTurn(run, t)
		a.waiting.Add(-1)
	}
}

// takeTurn sends t's request to the handler and waits for the answer.
func (a *Agent) takeTurn(ctx context.Context, t *turn) {
	if t.s != nil {
		if t.state.CompareAndSwap(turnWaiting, turnSending) {
			if t.timer != nil {
				t.timer.Stop()
			}
			a.sendLive(ctx, t)
			return
		}
		select { // deferred: sent as a queued one, once the relay has its answer
		case <-t.answered:
		case <-ctx.Done():
			return
		}
		if !t.queued {
			return
		}
	}
	select {
	case <-t.saved:
	case <-ctx.Done():
		return
	}
	if t.err != nil || t.skip {
		return
	}
	c, err := a.store.Capture(ctx, t.id)
	if err != nil {
		a.log.Error("load queued capture", "id", t.id, "err", err)
		return
	}
	if c.Target == "" && a.forwardTo != nil {
		c.Target = joinTarget(a.forwardTo, c.Path, c.Query)
	}
	a.deliver(ctx, c, 1)
}

// sendLive sends a live request whose turn came, as serveLive does.
func (a *Agent) sendLive(ctx context.Context, t *turn) {
	defer t.s.Release()
	if a.savesFailing() {
		<-t.saved // a request not saved must not reach the handler
	}
	select {
	case <-t.saved:
		if t.err != nil {
			t.s.Respond(refusal(t.err)) // its sender sends it again: the handler need not see it now
			return
		}
	default:
	}
	res := a.send(context.Background(), t.c, t.h, t.s.Limits(), nil)
	<-t.saved // comes: every queued write is told its outcome
	if t.err != nil {
		t.s.Respond(refusalAfterForward(t.err))
		return
	}
	t.s.Respond(a.record(t.c, 1, res))
}
