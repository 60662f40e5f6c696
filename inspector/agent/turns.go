package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// The turn lines: tunnel requests that reach their handler one at a time,
// in arrival order (turnLoop): the relay's queued ones, those an earlier
// run saved but did not send, and live ones that arrived behind them
// (planInTurn). There is a line per route (a lane), so that a slow or
// down handler holds up its own route's requests and no other's; without
// a route file there is one, the "" lane.

// A lane is one route's turn line.
type lane struct {
	route   string        // read-only
	mu      sync.Mutex    // guards turns; taken alone
	turns   []*exchange   // guarded by mu: not yet taken by its turnLoop, in arrival order
	wake    chan struct{} // cap 1: wakes its turnLoop
	waiting atomic.Int64  // turns not done, the one at the handler included; 0 lets a live request of the route go straight
}

// laneFor is route's lane, made on first use; its loop is started then if
// Run is running and not yet draining (a lane made later keeps its turns
// for the next run, as a draining loop does).
func (a *Agent) laneFor(route string) *lane {
	a.lanesMu.Lock()
	defer a.lanesMu.Unlock()
	l := a.lanes[route]
	if l == nil {
		l = &lane{route: route, wake: make(chan struct{}, 1)}
		a.lanes[route] = l
		if ctx := a.laneCtx; ctx != nil && !a.lanesStopped {
			a.laneLoops.Go(func() { a.turnLoop(ctx, l) })
		}
	}
	return l
}

// runLanes starts the loops of the lanes made before Run (an earlier run's
// queued requests), and of every lane made from now on.
func (a *Agent) runLanes(ctx context.Context) {
	a.lanesMu.Lock()
	defer a.lanesMu.Unlock()
	a.laneCtx = ctx
	for _, l := range a.lanes {
		a.laneLoops.Go(func() { a.turnLoop(ctx, l) })
	}
}

// stopLanes waits, once the agent drains, for every lane's loop to end:
// no loop starts after it.
func (a *Agent) stopLanes() {
	<-a.draining
	a.lanesMu.Lock()
	a.lanesStopped = true
	a.lanesMu.Unlock()
	a.laneLoops.Wait()
}

// lineUp puts x at the end of the turn line; a live one is deferred
// (answered "queued") before the relay's forward timeout runs out.
func (a *Agent) lineUp(x *exchange) {
	if x.plan == planInTurn {
		x.answered = make(chan struct{})
		if ft := x.s.ForwardTimeout(); ft > 0 {
			x.timer = time.AfterFunc(ft-deferMargin(ft), func() {
				// Its waits end by themselves, so it may run after Run
				// has stopped waiting for tasks.
				if a.enter() {
					defer a.tasks.Done()
				}
				a.deferTurn(x)
			})
		}
	}
	a.addTurn(x)
}

// closedChan is the saved channel of a capture saved before this run.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// addTurn puts x at the end of its route's line.
func (a *Agent) addTurn(x *exchange) {
	l := a.laneFor(x.route)
	l.waiting.Add(1)
	l.mu.Lock()
	l.turns = append(l.turns, x)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
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

// deferLater answers x "queued" on a goroutine of its own, Run waiting for
// it, since its save may still be under way.
func (a *Agent) deferLater(x *exchange) {
	if x.plan != planInTurn || x.s.ForwardTimeout() <= 0 {
		return // queued already; or a relay that knows no "queued": it waits
	}
	if x.timer != nil {
		x.timer.Stop()
	}
	if !a.start(func() { a.deferTurn(x) }) {
		go a.deferTurn(x) // the agent is closing: its waits still end by themselves
	}
}

// deferMargin is how long before the relay's forward timeout a live request
// still waiting for its turn is answered "queued": time to commit its
// queued mark behind the writes already in line (a busy queue's answers)
// and for the answer to reach the relay, whose clock started first.
func deferMargin(ft time.Duration) time.Duration { return min(ft/2, 3*time.Second) }

// deferTurn answers a live request still waiting for its turn "queued",
// once it is saved and marked queued, so that a restart before its turn
// still sends it (UndeliveredQueued).
func (a *Agent) deferTurn(x *exchange) {
	if !x.state.CompareAndSwap(xWaiting, xDeferred) {
		return // turnLoop took it
	}
	defer close(x.answered)
	<-x.saved // comes: every queued write is told its outcome
	if x.err != nil {
		x.finish(refusal(x.err))
		return
	}
	kept := *x.c
	kept.Queued, kept.ArrivedAt = true, x.arrivedAt
	if err := a.cm.save(context.Background(), writeOp{update: &kept, keep: true}); err != nil {
		x.finish(refusal(err)) // the agent is stopping
		return
	}
	x.queued = true
	x.finish(&wire.Response{Result: wire.ResultQueued})
}

// turnLoop sends a route's tunnel requests that must wait for their turn
// to its handler, one at a time, in arrival order, until the agent drains: then
// the turn at the handler finishes, and the live requests still waiting
// are answered "queued" (deferLater), to be sent with the queued ones, in
// their order, by the next run (UndeliveredQueued).
func (a *Agent) turnLoop(ctx context.Context, l *lane) {
	// A turn taken runs to its end: a request at the handler whose answer
	// is not recorded would be sent again by the next run.
	run := context.WithoutCancel(ctx)
	for {
		if a.isDraining() {
			l.mu.Lock()
			left := l.turns
			l.turns = nil
			l.mu.Unlock()
			for _, x := range left {
				a.deferLater(x)
			}
			return
		}
		x := l.next()
		if x == nil {
			select {
			case <-l.wake:
			case <-a.draining:
			}
			continue
		}
		a.takeTurn(run, x)
		l.waiting.Add(-1)
	}
}

// next takes the first exchange off the line; nil when it is empty.
func (l *lane) next() *exchange {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.turns) == 0 {
		return nil
	}
	x := l.turns[0]
	l.turns[0] = nil
	l.turns = l.turns[1:]
	return x
}

// takeTurn sends x's request to the handler and waits for the answer.
func (a *Agent) takeTurn(ctx context.Context, x *exchange) {
	if x.plan == planInTurn {
		if x.state.CompareAndSwap(xWaiting, xSending) {
			if x.timer != nil {
				x.timer.Stop()
			}
			a.sendSaved(x, false)
			return
		}
		select { // deferred: sent as a queued one, once the relay has its answer
		case <-x.answered:
		case <-ctx.Done():
			return
		}
		if !x.queued {
			return
		}
	}
	select {
	case <-x.saved:
	case <-ctx.Done():
		return
	}
	if x.err != nil || x.skip {
		return
	}
	c, ok := a.loadForTurn(x.id)
	if !ok || c.Status == agentdb.StatusStored {
		return
	}
	if c.Target == "" {
		a.retarget(c) // saved by a run that had no handler for it
	}
	a.deliver(ctx, c, 1)
}

// captureLoader reads a capture back. The store is the agent's; a test's
// fails a read as a store that cannot apply its log does (export_test.go).
type captureLoader interface {
	Capture(ctx context.Context, id string) (*agentdb.Capture, error)
}

// loadForTurn reads a saved request back from the store for its turn. A
// read that fails keeps the turn: the store may be unable to apply its
// intake log for a while (a full disk), and the requests behind this one
// must not overtake it (the chaos run's team seed 3301 saw a queued
// request dropped from its turn on a full disk, and the requests after it
// reach the handler 84 s before it). It is read again after a pause, as a
// failed commit is tried again, until it is read, it is gone (deleted: its
// turn is over), or the agent drains: then the next start sends it first
// (UndeliveredQueued). ok is false when there is nothing to deliver.
func (a *Agent) loadForTurn(id string) (c *agentdb.Capture, ok bool) {
	var pause time.Duration
	for failures := 0; ; failures++ {
		c, err := a.loader.Capture(context.Background(), id)
		if err == nil {
			return c, true
		}
		if errors.Is(err, storage.ErrNotFound) {
			return nil, false
		}
		if failures == 0 {
			a.log.Error("reading a saved request back for its turn; the requests behind it wait", "id", id, "err", err)
		}
		pause = nextPause(pause)
		select {
		case <-time.After(pause):
		case <-a.draining:
			a.log.Warn("a saved request not read back before the stop is sent first by the next start", "id", id, "err", err)
			return nil, false
		}
	}
}
