package agent

import (
	"context"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/storage/agentdb"
)

// writeOp is one insert or update for writeLoop, with what to do after the
// commit.
type writeOp struct {
	insert *agentdb.Capture
	update *agentdb.Capture
	ack    *relay.Stream // acknowledged to the relay once the insert is committed
	after  func(error)
	// keep: should the commit fail, the write is tried again (with the
	// next one, or after a pause) until it succeeds, and after is called
	// only then. For writes nobody can be told failed: a queued request
	// (its sender has its 202 and the relay waits for the ack, in order)
	// and a response already passed on. A live request is not kept: its
	// sender gets a 502 and sends it again.
	keep bool
}

// writeLoop commits whatever queued up while the previous commit ran in
// one commit, with the handler's answers waiting to be recorded
// (responses). A live request alone in the tunnel commits itself
// (commitAlone); every other write goes through here. The kept writes of a
// failed commit (writeOp.keep) go first into the next one, in their order,
// as do its answers, which is tried with the next write or after a pause,
// whichever comes first: a full disk that gets room again is used again
// by itself.
func (a *Agent) writeLoop(ctx context.Context) {
	const maxBatch = 256
	batch := make([]writeOp, 0, maxBatch)
	var (
		acks  []*relay.Stream
		kept  []writeOp     // of the last commit, which failed
		pause time.Duration // before trying them again
	)
	again := time.NewTimer(time.Hour)
	again.Stop()
	// Once ctx ends, what is queued is committed, without waiting for
	// more, and writeLoop returns.
	done := ctx.Done()
	stopping := false
	for {
		batch = append(batch[:0], kept...)
		kept = kept[:0]
		var wake <-chan time.Time
		if (len(batch) > 0 || pause > 0 && a.answers.len() > 0) && !stopping {
			again.Reset(pause)
			wake = again.C
		}
		due := a.answers.due
		if pause > 0 {
			due = nil // commits fail: answers wait for the pause, as kept writes do
		}
		if !stopping {
			select {
			case op := <-a.ops:
				batch = append(batch, op)
			case <-due:
			case <-wake:
			case <-done:
				stopping, done = true, nil
			}
		}
		if wake != nil {
			again.Stop()
		}
	more:
		for len(batch) < maxBatch {
			select {
			case op := <-a.ops:
				batch = append(batch, op)
			default:
				break more
			}
		}
		a.commitMu.Lock()
		answers := a.answers.take()
		if len(batch) == 0 && len(answers) == 0 {
			a.commitMu.Unlock()
			if stopping {
				return
			}
			continue
		}
		var inserts, updates []*agentdb.Capture
		for _, op := range batch {
			if op.insert != nil {
				inserts = append(inserts, op.insert)
			}
			if op.update != nil {
				updates = append(updates, op.update)
			}
		}
		updates = append(updates, answers...)
		written, err := a.captures.LogCaptures(context.WithoutCancel(ctx), inserts, updates)
		if err != nil {
			a.answers.giveBack(answers)
			for _, op := range batch {
				if op.keep {
					kept = append(kept, op)
				}
			}
			pause = min(max(2*pause, minWritePause), maxWritePause)
			a.saveFailed(err)
			a.log.Debug("saving captures", "err", err, "inserts", len(inserts), "updates", len(updates), "trying_again", len(kept)+len(answers), "in", pause)
		} else {
			pause = 0
			a.committedResponses(answers)
		}
		a.commitMu.Unlock()
		if err == nil {
			// One write for all of the commit's acks, before any delivery.
			acks = acks[:0]
			for _, op := range batch {
				if op.ack != nil {
					acks = append(acks, op.ack)
				}
			}
			relay.AckAll(acks)
		}
		nth := 0 // the insert's index in written
		for _, op := range batch {
			if err == nil {
				if op.insert != nil {
					// The capture is writeLoop's until its op's after runs.
					a.committedInsert(op.insert, written[nth])
				} else if op.update != nil {
					a.publish(Event{Capture: op.update})
				}
			}
			if op.insert != nil {
				nth++
			}
			if err != nil && op.keep {
				continue // in kept
			}
			if op.after != nil {
				op.after(err)
			}
		}
		a.sendReplies()
		if stopping && err != nil {
			a.abandon(kept, errStopped) // the disk fails as the agent stops
			return
		}
	}
}

// committedInsert takes what the store assigned to a capture it just
// committed, and tells the inspector and the media saver, unless the
// relay sent a capture already saved again.
func (a *Agent) committedInsert(c *agentdb.Capture, w agentdb.Written) {
	c.Seq, c.ID, c.DuplicateOf = w.Seq, w.ID, w.DuplicateOf
	if w.Redelivered {
		return
	}
	a.publish(Event{Capture: c})
	if a.media != nil {
		a.media.SaveCapture(c) // returns at once
	}
}

// The pause before kept writes are tried again starts at minWritePause and
// doubles while commits keep failing, up to maxWritePause: a full disk is
// not hammered, and one that has room again is found soon.
const (
	minWritePause = 50 * time.Millisecond
	maxWritePause = 2 * time.Second
)

// abandon ends the writes writeLoop still holds when the agent stops. A
// queued request not acknowledged is sent again by the relay next time.
func (a *Agent) abandon(ops []writeOp, err error) {
	for _, op := range ops {
		if op.after != nil {
			op.after(err)
		}
	}
	a.sendReplies()
}

// save queues a write and waits for its commit.
func (a *Agent) save(ctx context.Context, op writeOp) error {
	done := make(chan error, 1)
	op.after = func(err error) { done <- err }
	if err := a.queue(ctx, op); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// queue hands op to writeLoop. Once it has, op.after is called in the end,
// whatever happens; it has not when queue fails, once the agent has
// stopped or ctx has ended.
func (a *Agent) queue(ctx context.Context, op writeOp) error {
	a.stopMu.RLock()
	defer a.stopMu.RUnlock()
	if a.stopped {
		return errStopped
	}
	select {
	case a.ops <- op:
		return nil
	case <-a.quit:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Settle waits, when responses are still waiting to be committed (see
// responses), until they are: readers of the store then see every
// response the agent already sent back.
func (a *Agent) Settle(ctx context.Context) {
	if a.unsettled.Load() > 0 {
		a.Flush(ctx)
	}
}

// Flush waits until every write queued before it is committed.
func (a *Agent) Flush(ctx context.Context) error { return a.save(ctx, writeOp{}) }
