package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/storage"

	"github.com/calltap/calltap/storage/agentdb"
)

// committer commits every capture the agent saves and every answer it
// records; what it is doing decides how a tunnel request is served
// (Agent.choose picks the plan from it): a request alone in the tunnel is committed
// inline, on the goroutine that sends it (commitInline); every other write
// goes through the write queue to loop, which commits whatever queued up
// while its last commit ran in one commit. Both take the handler's answers
// waiting to be recorded (answers) into their commit; the linger timer has
// loop commit them should no commit come by within responseLinger. A
// failed commit puts the agent in save-first mode (failedAt) and loop tries
// its kept writes again after a pause that doubles from minWritePause to
// maxWritePause.
//
// Goroutines: loop (started by Run) owns the batch, the kept writes and the
// pause; a lone request's goroutine commits inline; any goroutine queues.
// Whoever commits holds mu from taking the answers until they are committed
// or given back, so that two answers of one capture commit in the order
// they were recorded; it holds mu across the store's write and sync.
// Lock order: mu, then answers.mu (taken briefly by take and giveBack; add
// takes it without mu); replyMu and stopMu are never held with another
// lock, and no lock is held across a relay write (ackAll, finishAll and
// the afters run after mu is let go).
type committer struct {
	captures        captureWriter                               // set by New (a test's by NewWritingThrough), then read-only
	log             *slog.Logger                                // read-only
	committedInsert func(c *agentdb.Capture, w agentdb.Written) // the Agent's: tells the inspector and the media saver; read-only
	committedAnswer func(c *agentdb.Capture)                    // the Agent's: tells the inspector of an answer or update committed; called holding mu (by commit); read-only

	ops       chan writeOp // the write queue: any goroutine sends (queue), loop receives
	answers   *responses   // the handler's answers waiting to be recorded, with the linger timer
	unsettled atomic.Int64 // answers recorded and not yet committed
	mu        sync.Mutex   // held across a commit, by loop or commitInline: it guards no field, it keeps commits one at a time and in the order taken (see above)

	live     atomic.Int64 // live requests not yet answered (alone, alongside): 0 lets the next one go alone
	failedAt atomic.Int64 // unix ns of the last failed commit, 0 once saves work again: save-first mode
	failures atomic.Int64 // commits failed since saves last worked, for the log

	replyMu sync.Mutex
	replies []*exchange // guarded by replyMu: answers that fell to the committer's side (alongside)

	quit    chan struct{} // closed by stop: frees a queue call blocked on a full queue
	stopMu  sync.RWMutex
	stopped bool // guarded by stopMu: set by stop, after which nothing is queued
}

func newCommitter(captures captureWriter, log *slog.Logger) *committer {
	return &committer{
		captures: captures,
		log:      log,
		ops:      make(chan writeOp, 1024),
		answers:  newResponses(),
		quit:     make(chan struct{}),
	}
}

// captureWriter commits captures and the answers recorded on them. The
// store is the agent's; a test's fails a commit as a full disk does
// (export_test.go).
type captureWriter interface {
	LogCaptures(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error)
}

// errStopped is why a write or a replay is refused once Run has stopped.
var errStopped = errors.New("agent: stopped")

// writeOp is one insert or update for the committer, with what to do after
// the commit. Made by whoever queues it; loop's from then on, the captures
// it points at included, until after runs.
type writeOp struct {
	insert *agentdb.Capture // a capture to add; the store gives it its seq and, if sent again, its first copy's id
	update *agentdb.Capture // a capture to change (a deferred request's queued mark)
	ack    *exchange        // acknowledged to the relay once the insert is committed (ackAll)
	after  func(error)      // told the commit's outcome, on loop's goroutine (or queue's caller, once stopped); whoever runs it must then call sendReplies, which sends the answers it may have added (addReply)
	// keep: should the commit fail, the write is tried again (with the
	// next one, or after a pause) until it succeeds, and after is called
	// only then. For writes nobody can be told failed: a queued request
	// (its sender has its 202 and the relay waits for the ack, in order)
	// and a response already passed on. A live request is not kept: its
	// sender gets a 503 and sends it again.
	keep bool
}

// maxBatch is the most writes loop takes into one commit.
const maxBatch = 256

// The pause before kept writes are tried again starts at minWritePause and
// doubles while commits keep failing, up to maxWritePause: a full disk is
// not hammered, and one that has room again is found soon.
const (
	minWritePause = 50 * time.Millisecond
	maxWritePause = 2 * time.Second
)

// nextPause is the pause after a failed commit, the last one being pause.
func nextPause(pause time.Duration) time.Duration {
	return min(max(2*pause, minWritePause), maxWritePause)
}

// batch is loop's state between commits; owned by loop.
type batch struct {
	ops      []writeOp       // this commit's writes, kept ones first
	acks     []*exchange     // those of ops that wait for their ack, when the commit succeeds
	kept     []writeOp       // of the last commit, which failed
	pause    time.Duration   // before trying them again; 0 while commits work
	again    *time.Timer     // ends the pause
	done     <-chan struct{} // ctx's end; nil once seen
	stopping bool            // ctx ended: commit what is queued, then return
}

// loop commits whatever queued up while the previous commit ran in one
// commit, with the answers waiting. The kept writes of a failed commit
// (writeOp.keep) go first into the next one, in their order, as do its
// answers, which is tried with the next write or after the pause,
// whichever comes first: a full disk that gets room again is used again by
// itself. Once ctx ends, what is queued is committed, without waiting for
// more, and loop returns.
func (cm *committer) loop(ctx context.Context) {
	b := &batch{ops: make([]writeOp, 0, maxBatch), again: time.NewTimer(time.Hour), done: ctx.Done()}
	b.again.Stop()
	for {
		cm.wait(b)
		cm.gather(b)
		ran, err := cm.commitBatch(ctx, b)
		if b.stopping && (!ran || err != nil) {
			cm.abandon(b.kept, errStopped) // the disk fails as the agent stops
			return
		}
	}
}

// wait fills b with its kept writes and blocks, unless stopping, until
// there is something to commit: a write, the linger timer's answers (not
// during a pause: they wait for it, as kept writes do), the pause's end,
// or ctx's end.
func (cm *committer) wait(b *batch) {
	b.ops = append(b.ops[:0], b.kept...)
	b.kept = b.kept[:0]
	if b.stopping {
		return
	}
	var wake <-chan time.Time
	if len(b.ops) > 0 || b.pause > 0 && cm.answers.len() > 0 {
		b.again.Reset(b.pause)
		wake = b.again.C
		defer b.again.Stop()
	}
	due := cm.answers.due
	if b.pause > 0 {
		due = nil
	}
	select {
	case op := <-cm.ops:
		b.ops = append(b.ops, op)
	case <-due:
	case <-wake:
	case <-b.done:
		b.stopping, b.done = true, nil
	}
}

// gather adds to b what else is queued, up to maxBatch.
func (cm *committer) gather(b *batch) {
	for len(b.ops) < maxBatch {
		select {
		case op := <-cm.ops:
			b.ops = append(b.ops, op)
		default:
			return
		}
	}
}

// commitBatch commits b's writes with the answers waiting, then ends them:
// one write of the acks, the afters, one write of the answers that fell to
// the committer. ran is false when there was nothing to commit.
func (cm *committer) commitBatch(ctx context.Context, b *batch) (ran bool, err error) {
	var inserts, updates []*agentdb.Capture
	for _, op := range b.ops {
		if op.insert != nil {
			inserts = append(inserts, op.insert)
		}
		if op.update != nil {
			updates = append(updates, op.update)
		}
	}
	ran, written, err := cm.commit(context.WithoutCancel(ctx), inserts, updates, len(b.ops) == 0)
	if !ran {
		return false, nil
	}
	if err != nil {
		b.pause = nextPause(b.pause)
		for _, op := range b.ops {
			if op.keep {
				b.kept = append(b.kept, op)
			}
		}
		cm.log.Debug("saving captures", "err", err, "inserts", len(inserts), "updates", len(updates), "trying_again", len(b.kept), "in", b.pause)
	} else {
		b.pause = 0
		b.acks = b.acks[:0]
		for _, op := range b.ops {
			if op.ack != nil {
				b.acks = append(b.acks, op.ack)
			}
		}
		ackAll(b.acks) // one write for all of the commit's acks, before any delivery
	}
	cm.endWrites(b.ops, written, err)
	return true, err
}

// endWrites tells each write of a commit its outcome (those kept to be
// tried again excepted), then sends the answers that fell to the
// committer's side, together.
func (cm *committer) endWrites(ops []writeOp, written []agentdb.Written, err error) {
	nth := 0 // the insert's index in written
	for _, op := range ops {
		switch {
		case err != nil:
		case op.insert != nil:
			// The capture is the committer's until its op's after runs.
			cm.committedInsert(op.insert, written[nth])
		case op.update != nil:
			cm.committedAnswer(op.update)
		}
		if op.insert != nil {
			nth++
		}
		if err != nil && op.keep {
			continue
		}
		if op.after != nil {
			op.after(err)
		}
	}
	cm.sendReplies()
}

// commitInline commits the capture of a request served alone, with the
// answers waiting, on the caller's goroutine. Run waits for that goroutine
// before it stops the committer, so the store is still open.
func (cm *committer) commitInline(c *agentdb.Capture) error {
	_, written, err := cm.commit(context.Background(), []*agentdb.Capture{c}, nil, false)
	if err != nil {
		cm.log.Debug("saving a capture", "err", err)
		return err
	}
	cm.committedInsert(c, written[0])
	return nil
}

// commit commits inserts and updates with the answers waiting, holding mu
// throughout: the store's LogCaptures and committedAnswer (which takes the
// inspector's hub lock) run under it (see the package comment's lock
// order). A failed commit gives the answers back, in front, and puts
// the agent in save-first mode. ran is false, and nothing is committed,
// when there was nothing to: no answers waiting and skipEmpty.
func (cm *committer) commit(ctx context.Context, inserts, updates []*agentdb.Capture, skipEmpty bool) (ran bool, written []agentdb.Written, err error) {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	answers := cm.answers.take()
	if skipEmpty && len(answers) == 0 {
		return false, nil, nil
	}
	written, err = cm.captures.LogCaptures(ctx, inserts, append(updates, answers...))
	if err != nil {
		cm.answers.giveBack(answers)
		cm.saveFailed(err)
		return true, nil, err
	}
	for _, c := range answers {
		cm.committedAnswer(c)
	}
	cm.unsettled.Add(-int64(len(answers)))
	return true, written, nil
}

// addAnswer queues c, the handler's answer recorded on its capture, for the
// next commit.
func (cm *committer) addAnswer(c *agentdb.Capture) {
	cm.unsettled.Add(1)
	cm.answers.add(c)
}

// addReply has the committer send x's answer with those of the commit
// under way (sendReplies): its handler answered before its commit ended.
func (cm *committer) addReply(x *exchange) {
	cm.replyMu.Lock()
	cm.replies = append(cm.replies, x)
	cm.replyMu.Unlock()
}

// sendReplies sends the answers that fell to the committer's side
// together. Whoever ends writes calls it after their afters have run.
func (cm *committer) sendReplies() {
	cm.replyMu.Lock()
	xs := cm.replies
	cm.replies = nil
	cm.replyMu.Unlock()
	finishAll(xs)
}

// abandon ends the writes the committer still holds when the agent stops.
// A queued request not acknowledged is sent again by the relay next time.
func (cm *committer) abandon(ops []writeOp, err error) {
	for _, op := range ops {
		if op.after != nil {
			op.after(err)
		}
	}
	cm.sendReplies()
}

// queue hands op to loop. Once it has, op.after is called in the end,
// whatever happens; it has not when queue fails, once the agent has
// stopped or ctx has ended.
func (cm *committer) queue(ctx context.Context, op writeOp) error {
	cm.stopMu.RLock()
	defer cm.stopMu.RUnlock()
	if cm.stopped {
		return errStopped
	}
	select {
	case cm.ops <- op:
		return nil
	case <-cm.quit:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// queueOrEnd queues op, or tells op.after why it could not.
func (cm *committer) queueOrEnd(op writeOp) {
	if err := cm.queue(context.Background(), op); err != nil {
		op.after(err)
		cm.sendReplies()
	}
}

// save queues a write and waits for its commit.
func (cm *committer) save(ctx context.Context, op writeOp) error {
	done := make(chan error, 1)
	op.after = func(err error) { done <- err }
	if err := cm.queue(ctx, op); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop ends the committer once loop has returned: writes queued from now
// on are refused, those still in the queue are abandoned, and the answers
// a failing disk gave back are kept in the answer reserve (spill) for the
// next run to record.
func (cm *committer) stop(spill func([]*agentdb.Capture)) {
	close(cm.quit)
	cm.stopMu.Lock()
	cm.stopped = true
	cm.stopMu.Unlock()
	for {
		select {
		case op := <-cm.ops:
			cm.abandon([]writeOp{op}, errStopped)
		default:
			cm.answers.timer.Stop()
			left := cm.answers.take()
			cm.unsettled.Add(-int64(len(left)))
			spill(left)
			return
		}
	}
}

// Save-first mode. When the agent cannot save (a full disk, mostly), a
// live request must not reach the handler: its sender is refused, retries,
// and each retry would reach the handler again. So a failed commit puts
// the agent in save-first mode (failedAt): a live request is committed
// before it is forwarded (planSaveFirst), and refused with 503 and
// Retry-After, naming the cause, if the commit fails. (The commit that
// fails first, alone or alongside, is that of a request forwarded already:
// its sender is told 503 outcome_unknown, the handler may have it.) The
// first commit that succeeds takes requests again, with no pause; the
// overlap of commit and handler comes back once commits have succeeded for
// saveFirstLinger, so that a disk at its edge does not send each retry to
// the handler again. The fast path pays one atomic load for all this.

// saveFirstLinger is how long after the last failed commit live requests
// are still committed before they are forwarded.
const saveFirstLinger = time.Second

// saveFailed records that a commit failed; commit calls it before anyone
// is told the outcome.
func (cm *committer) saveFailed(err error) {
	if cm.failedAt.Swap(time.Now().UnixNano()) == 0 {
		cm.log.Error("the agent cannot save requests: live requests are refused (503) until a save succeeds", "err", err, "disk_full", storage.IsDiskFull(err))
	}
	cm.failures.Add(1)
}

// savedAgain records that a live request was committed in save-first mode.
func (cm *committer) savedAgain() {
	f := cm.failedAt.Load()
	if f == 0 || time.Since(time.Unix(0, f)) < saveFirstLinger || !cm.failedAt.CompareAndSwap(f, 0) {
		return
	}
	cm.log.Info("the agent saves requests again", "failed_commits", cm.failures.Swap(0))
}

// savesFailing reports whether live requests are committed before they are
// forwarded (see saveFailed).
func (cm *committer) savesFailing() bool { return cm.failedAt.Load() != 0 }
