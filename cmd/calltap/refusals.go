package main

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// refusalReportEvery is how often the console sums up refused senders.
const refusalReportEvery = 10 * time.Second

// refusalReport turns the relay's running count of senders refused for a
// missing --require-header into console lines: the first refusals at once,
// then at most one line per interval with the count since the last line,
// so that a flood of refusals prints a few lines, not one each.
type refusalReport struct {
	out   io.Writer
	every time.Duration

	mu         sync.Mutex
	seen       int64       // the relay's count last heard
	unreported int64       // refusals not printed yet
	printedAt  time.Time   // when the last line was printed
	timer      *time.Timer // pending summary; nil when none
	stopped    bool
}

// note takes the relay's running count. The count only grows while the
// relay runs; a smaller one (a connection's first state, or a restarted
// relay) adds nothing.
func (r *refusalReport) note(total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if total <= r.seen || r.stopped {
		return
	}
	r.unreported += total - r.seen
	r.seen = total
	if r.timer != nil {
		return // the summary due will carry these
	}
	if wait := time.Until(r.printedAt.Add(r.every)); wait > 0 {
		r.timer = time.AfterFunc(wait, r.summarise)
		return
	}
	r.printLocked("")
}

// summarise prints what came in since the last line, an interval ago.
func (r *refusalReport) summarise() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = nil
	if !r.stopped {
		r.printLocked(" in the last " + r.every.String())
	}
}

// stop prints what was not reported yet and ends the summaries.
func (r *refusalReport) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.printLocked("")
	r.stopped = true
}

func (r *refusalReport) printLocked(period string) {
	if r.unreported == 0 {
		return
	}
	fmt.Fprintf(r.out, "  relay refused %d request(s) without the required header%s\n", r.unreported, period)
	r.unreported = 0
	r.printedAt = time.Now()
}
