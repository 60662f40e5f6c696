package agent

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/storage/agentdb"
)

// responses are the handler's answers waiting to be recorded; the
// committer owns them. Nobody waits for one (the sender has its answer),
// so recording one wakes nobody: the next commit takes them all, whoever
// makes it — the committer's loop or a lone request's goroutine
// (commitInline) — and a timer has loop commit them should no commit come
// by within responseLinger.
//
// Whoever takes them holds the committer's mu until its commit is over
// and gives back what failed, in front: two answers of one capture (a
// delivery and its retry) are committed in the order they were recorded.
type responses struct {
	mu    sync.Mutex
	caps  []*agentdb.Capture // guarded by mu: in the order recorded
	armed atomic.Bool        // the timer is set; it is set once per linger, not once per answer
	timer *time.Timer        // the linger timer: set by newResponses, then read-only
	due   chan struct{}      // cap 1: tells loop the timer went off with answers waiting
}

func newResponses() *responses {
	r := &responses{due: make(chan struct{}, 1)}
	r.timer = time.AfterFunc(time.Hour, r.fire)
	r.timer.Stop()
	return r
}

// add queues c's answer to be recorded.
func (r *responses) add(c *agentdb.Capture) {
	r.mu.Lock()
	r.caps = append(r.caps, c)
	r.mu.Unlock()
	r.arm()
}

// arm sets the timer unless it is set.
func (r *responses) arm() {
	if r.armed.CompareAndSwap(false, true) {
		r.timer.Reset(responseLinger)
	}
}

func (r *responses) fire() {
	r.armed.Store(false)
	if r.len() > 0 {
		select {
		case r.due <- struct{}{}:
		default:
		}
	}
}

// take returns the answers waiting, and forgets them. The caller holds
// the committer's mu until it has committed them or given them back.
func (r *responses) take() []*agentdb.Capture {
	r.mu.Lock()
	defer r.mu.Unlock()
	caps := r.caps
	r.caps = nil
	return caps
}

// giveBack returns answers taken whose commit failed, ahead of any
// recorded since; should no commit come by, loop tries them again
// (and, while commits fail, again after its pause).
func (r *responses) giveBack(caps []*agentdb.Capture) {
	if len(caps) == 0 {
		return
	}
	r.mu.Lock()
	r.caps = append(caps, r.caps...)
	r.mu.Unlock()
	r.arm()
}

func (r *responses) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.caps)
}

// responseLinger is how long a recorded answer waits, at most, for a
// commit to share.
const responseLinger = 5 * time.Millisecond
