package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// disk is a real agent store whose commits a test can hold up or fail the
// way a full disk does, and which remembers each commit it was asked for.
type disk struct {
	store *agentdb.AgentStore

	mu      sync.Mutex
	full    bool           // guarded by mu: commits fail with ENOSPC
	hold    chan struct{}  // guarded by mu: a commit waits until it is closed
	commits []commitRecord // guarded by mu

	published []*agentdb.Capture // guarded by mu: what runCommitter's committer said it committed as answers or updates
}

// commitRecord is one commit the store was asked for.
type commitRecord struct {
	at               time.Time
	inserts, updates []*agentdb.Capture
	failed           bool
}

func openDisk(t *testing.T) *disk {
	t.Helper()
	db, err := agentdb.OpenAgent(context.Background(), filepath.Join(t.TempDir(), "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &disk{store: db}
}

func (d *disk) LogCaptures(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error) {
	d.mu.Lock()
	hold, full := d.hold, d.full
	d.commits = append(d.commits, commitRecord{at: time.Now(), inserts: inserts, updates: updates, failed: full})
	d.mu.Unlock()
	if hold != nil {
		<-hold
	}
	if full {
		return nil, fmt.Errorf("storage: append: %w", syscall.ENOSPC)
	}
	return d.store.LogCaptures(ctx, inserts, updates)
}

func (d *disk) setFull(full bool) { d.mu.Lock(); d.full = full; d.mu.Unlock() }

func (d *disk) holdCommits() (release func()) {
	ch := make(chan struct{})
	d.mu.Lock()
	d.hold = ch
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		d.hold = nil
		d.mu.Unlock()
		close(ch)
	}
}

func (d *disk) record() []commitRecord {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]commitRecord(nil), d.commits...)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// runCommitter starts a committer over d and its loop; the returned stop
// ends the loop, as Run does, and stops the committer, spilling into the
// slice it returns.
func runCommitter(t *testing.T, d *disk) (cm *committer, stop func() []*agentdb.Capture) {
	t.Helper()
	cm = newCommitter(d, quiet)
	cm.committedInsert = func(c *agentdb.Capture, w agentdb.Written) { c.Seq, c.ID = w.Seq, w.ID }
	cm.committedAnswer = func(c *agentdb.Capture) {
		d.mu.Lock()
		d.published = append(d.published, c)
		d.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); cm.loop(ctx) }()
	stopped := false
	stop = func() []*agentdb.Capture {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		<-done
		var spilled []*agentdb.Capture
		cm.stop(func(caps []*agentdb.Capture) { spilled = caps })
		return spilled
	}
	t.Cleanup(func() { stop() })
	return cm, stop
}

func testCapture(body string) *agentdb.Capture {
	return &agentdb.Capture{ID: newCaptureID(), Source: SourceTunnel, CreatedAt: time.Now().UTC(), Method: "POST", Path: "/hook",
		RequestHeaders: "[]", Body: []byte(body), Status: agentdb.StatusPending, MaxAttempts: 1, Duration: -1}
}

// insertOp is an insert whose outcome arrives on the channel it returns.
func insertOp(c *agentdb.Capture, keep bool) (writeOp, chan error) {
	done := make(chan error, 1)
	return writeOp{insert: c, keep: keep, after: func(err error) { done <- err }}, done
}

func wait(t *testing.T, ch chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("a write was never told its outcome")
		return nil
	}
}

// Writes queued while a commit runs go into the next one together, up to
// maxBatch a commit, in their order, and each is told its outcome once
// its commit is over.
func TestCommitterBatchesWhatQueuedMeanwhile(t *testing.T) {
	d := openDisk(t)
	cm, _ := runCommitter(t, d)
	release := d.holdCommits()
	first, firstDone := insertOp(testCapture(`{"n":-1}`), false)
	if err := cm.queue(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, 10*time.Second, func() bool { return len(d.record()) == 1 }, "the first commit never started")
	const n = maxBatch + 10
	dones := make([]chan error, n)
	for i := range n {
		var op writeOp
		op, dones[i] = insertOp(testCapture(fmt.Sprintf(`{"n":%d}`, i)), false)
		if err := cm.queue(context.Background(), op); err != nil {
			t.Fatal(err)
		}
	}
	release()
	if err := wait(t, firstDone); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := wait(t, dones[i]); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	commits := d.record()
	if len(commits) != 3 || len(commits[1].inserts) != maxBatch || len(commits[2].inserts) != 10 {
		sizes := []int{}
		for _, c := range commits {
			sizes = append(sizes, len(c.inserts))
		}
		t.Fatalf("commits of %v inserts, want [1 %d 10]", sizes, maxBatch)
	}
	for i, c := range append(commits[1].inserts, commits[2].inserts...) {
		if string(c.Body) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("insert %d of the batch is %s: out of order", i, c.Body)
		}
		if c.Seq == 0 {
			t.Fatalf("insert %d was not given its place in the store", i)
		}
	}
}

// A failed commit tells a write that is not kept its error at once; a
// kept one is tried again after a pause that doubles, and told only once
// it is saved. Meanwhile the agent is in save-first mode, until a commit
// of a live request succeeds saveFirstLinger after the last failure.
func TestCommitterKeepsWritesThroughFailures(t *testing.T) {
	d := openDisk(t)
	cm, _ := runCommitter(t, d)
	d.setFull(true)
	kept, keptDone := insertOp(testCapture(`{"kept":true}`), true)
	dropped, droppedDone := insertOp(testCapture(`{"kept":false}`), false)
	release := d.holdCommits() // both in the first commit
	cm.queue(context.Background(), kept)
	polltest.Until(t, 10*time.Second, func() bool { return len(d.record()) == 1 }, "the first commit never started")
	cm.queue(context.Background(), dropped)
	release()
	if err := wait(t, droppedDone); !storage.IsDiskFull(err) {
		t.Fatalf("a write not kept: told %v, want the full disk", err)
	}
	if !cm.savesFailing() || cm.failures.Load() == 0 {
		t.Fatal("a failed commit did not put the agent in save-first mode")
	}
	polltest.Until(t, 10*time.Second, func() bool { return len(d.record()) >= 5 }, "the kept write was not tried again")
	select {
	case err := <-keptDone:
		t.Fatalf("a kept write was told %v while its commits failed", err)
	default:
	}
	d.setFull(false)
	if err := wait(t, keptDone); err != nil {
		t.Fatal(err)
	}
	// The tries of the kept write alone: each after a pause at least as
	// long as nextPause gives.
	var tries []time.Time
	for _, c := range d.record() {
		if len(c.inserts) == 1 && string(c.inserts[0].Body) == `{"kept":true}` {
			tries = append(tries, c.at)
		}
	}
	pause := time.Duration(0)
	for i := 1; i < len(tries); i++ {
		pause = nextPause(pause)
		if got := tries[i].Sub(tries[i-1]); got < pause && i > 1 {
			t.Errorf("try %d came %s after the one before, want at least %s", i, got, pause)
		}
	}
	cm.savedAgain() // within saveFirstLinger of the failure: still saving first
	if !cm.savesFailing() {
		t.Error("save-first mode ended within saveFirstLinger of a failed commit")
	}
}

// The pause before kept writes are tried again doubles from
// minWritePause up to maxWritePause.
func TestNextPauseDoublesUpToItsMost(t *testing.T) {
	for _, c := range []struct{ last, want time.Duration }{
		{0, minWritePause},
		{minWritePause, 2 * minWritePause},
		{700 * time.Millisecond, 1400 * time.Millisecond},
		{maxWritePause / 2, maxWritePause},
		{1500 * time.Millisecond, maxWritePause},
		{maxWritePause, maxWritePause},
	} {
		if got := nextPause(c.last); got != c.want {
			t.Errorf("nextPause(%s) = %s, want %s", c.last, got, c.want)
		}
	}
}

// Save-first mode starts at a failed commit, is logged once however many
// follow, and ends at the first live request saved saveFirstLinger after
// the last failure.
func TestSaveFirstModeEntersAndLeaves(t *testing.T) {
	cm := newCommitter(nil, quiet)
	if cm.savesFailing() {
		t.Fatal("a new committer saves first")
	}
	cm.savedAgain()
	if cm.savesFailing() || cm.failures.Load() != 0 {
		t.Fatal("savedAgain with no failure changed the mode")
	}
	cm.saveFailed(errors.New("one"))
	cm.saveFailed(errors.New("two"))
	if !cm.savesFailing() || cm.failures.Load() != 2 {
		t.Fatalf("after two failures: failing %v, %d failures counted", cm.savesFailing(), cm.failures.Load())
	}
	cm.savedAgain()
	if !cm.savesFailing() {
		t.Fatal("save-first mode ended at once after a failure")
	}
	cm.failedAt.Store(time.Now().Add(-saveFirstLinger - time.Millisecond).UnixNano())
	cm.savedAgain()
	if cm.savesFailing() || cm.failures.Load() != 0 {
		t.Fatalf("saveFirstLinger after the last failure: failing %v, %d failures", cm.savesFailing(), cm.failures.Load())
	}
}

// An answer is committed with the next commit, whoever makes it; with no
// commit coming, the loop commits it itself, no sooner than responseLinger
// after it was recorded.
func TestAnswersLingerForACommit(t *testing.T) {
	d := openDisk(t)
	cm, _ := runCommitter(t, d)
	c := testCapture(`{}`)
	if err := cm.commitInline(c); err != nil {
		t.Fatal(err)
	}
	answer := *c
	answer.ResponseStatus, answer.Attempts, answer.Status = 201, 1, agentdb.StatusDelivered
	at := time.Now()
	cm.addAnswer(&answer)
	if cm.unsettled.Load() != 1 {
		t.Fatalf("%d answers unsettled, want 1", cm.unsettled.Load())
	}
	polltest.Until(t, 10*time.Second, func() bool { return cm.unsettled.Load() == 0 }, "the answer was never committed")
	commits := d.record()
	last := commits[len(commits)-1]
	if len(commits) != 2 || len(last.updates) != 1 || len(last.inserts) != 0 {
		t.Fatalf("%d commits, the last of %d inserts and %d updates; want the answer committed alone", len(commits), len(last.inserts), len(last.updates))
	}
	if waited := last.at.Sub(at); waited < responseLinger {
		t.Errorf("the answer was committed %s after it was recorded, before responseLinger (%s)", waited, responseLinger)
	}
	got, err := d.store.Capture(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ResponseStatus != 201 {
		t.Errorf("stored response %d, want 201", got.ResponseStatus)
	}

	// Recorded while a commit runs, it still lingers after that commit,
	// rather than making loop commit again at once.
	release := d.holdCommits()
	op, done := insertOp(testCapture(`{"during":true}`), false)
	cm.queue(context.Background(), op)
	polltest.Until(t, 10*time.Second, func() bool { return len(d.record()) == 3 }, "the commit never started")
	during := *c
	during.Attempts = 3
	at = time.Now()
	cm.addAnswer(&during)
	release()
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, 10*time.Second, func() bool { return cm.unsettled.Load() == 0 }, "the answer was never committed")
	commits = d.record()
	last = commits[len(commits)-1]
	if len(commits) != 4 || len(last.updates) != 1 || last.updates[0] != &during {
		t.Fatalf("%d commits; want the answer committed alone after the one under way", len(commits))
	}
	if waited := last.at.Sub(at); waited < responseLinger {
		t.Errorf("an answer recorded during a commit was committed %s after, before responseLinger (%s)", waited, responseLinger)
	}

	// The next inline commit takes the answers waiting with it.
	second := *c
	second.Attempts = 2
	cm.addAnswer(&second)
	c2 := testCapture(`{"second":true}`)
	if err := cm.commitInline(c2); err != nil {
		t.Fatal(err)
	}
	commits = d.record()
	last = commits[len(commits)-1]
	if len(last.inserts) != 1 || len(last.updates) != 1 || cm.unsettled.Load() != 0 {
		t.Errorf("the inline commit took %d inserts and %d updates, %d left unsettled; want the answer with it", len(last.inserts), len(last.updates), cm.unsettled.Load())
	}
}

// An inline commit that fails gives the answers it took back, ahead of
// those recorded since, and puts the agent in save-first mode.
func TestFailedInlineCommitGivesAnswersBack(t *testing.T) {
	d := openDisk(t)
	cm := newCommitter(d, quiet)
	cm.committedInsert = func(*agentdb.Capture, agentdb.Written) {}
	cm.committedAnswer = func(*agentdb.Capture) {}
	first, second := testCapture(`{"a":1}`), testCapture(`{"a":2}`)
	cm.addAnswer(first)
	d.setFull(true)
	if err := cm.commitInline(testCapture(`{}`)); !storage.IsDiskFull(err) {
		t.Fatalf("inline commit on a full disk: %v", err)
	}
	if !cm.savesFailing() {
		t.Error("a failed inline commit did not put the agent in save-first mode")
	}
	cm.addAnswer(second)
	got := cm.answers.take()
	if len(got) != 2 || got[0] != first || got[1] != second {
		t.Errorf("answers after the failure: %d, want the given-back one first", len(got))
	}
	cm.answers.timer.Stop()
}

// Stopping commits what is queued, then refuses writes; the answers a
// failing disk gave back are spilled for the next run, and a kept write
// whose last commit failed is told the agent stopped.
func TestCommitterStopsInOrder(t *testing.T) {
	d := openDisk(t)
	cm, stop := runCommitter(t, d)
	op, done := insertOp(testCapture(`{"last":true}`), false)
	release := d.holdCommits()
	cm.queue(context.Background(), op)
	polltest.Until(t, 10*time.Second, func() bool { return len(d.record()) == 1 }, "the commit never started")
	d.setFull(true)
	kept, keptDone := insertOp(testCapture(`{"kept":true}`), true)
	cm.queue(context.Background(), kept)
	answer := testCapture(`{"answer":true}`)
	cm.addAnswer(answer)
	release()
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	spilled := stop()
	if err := wait(t, keptDone); !errors.Is(err, errStopped) {
		t.Errorf("a kept write at the stop: told %v, want %v", err, errStopped)
	}
	if len(spilled) != 1 || spilled[0] != answer || cm.unsettled.Load() != 0 {
		t.Errorf("spilled %d answers, %d unsettled; want the one answer", len(spilled), cm.unsettled.Load())
	}
	if err := cm.queue(context.Background(), writeOp{}); !errors.Is(err, errStopped) {
		t.Errorf("a write after the stop: %v, want %v", err, errStopped)
	}
	late, lateDone := insertOp(testCapture(`{}`), false)
	cm.queueOrEnd(late)
	if err := wait(t, lateDone); !errors.Is(err, errStopped) {
		t.Errorf("queueOrEnd after the stop told %v, want %v", err, errStopped)
	}
}

// A stop commits whatever is queued before the loop returns.
func TestCommitterCommitsTheQueueAtTheStop(t *testing.T) {
	d := openDisk(t)
	cm, stop := runCommitter(t, d)
	release := d.holdCommits()
	var dones []chan error
	for i := range 5 {
		op, done := insertOp(testCapture(fmt.Sprintf(`{"n":%d}`, i)), false)
		cm.queue(context.Background(), op)
		dones = append(dones, done)
	}
	polltest.Until(t, 10*time.Second, func() bool { return len(d.record()) == 1 }, "the commit never started")
	go func() { time.Sleep(10 * time.Millisecond); release() }()
	stop()
	for i, done := range dones {
		if err := wait(t, done); err != nil {
			t.Errorf("write %d queued before the stop: %v", i, err)
		}
	}
}

// An exchange's plan follows what the agent is doing: queued requests
// queue; a live one waits its turn behind requests in the turn line, is
// saved first while commits fail, and is served alone only when no other
// live request is in flight and its body is small and its target http.
func TestChoosePlan(t *testing.T) {
	d := openDisk(t)
	a, err := New(Config{Store: d.store, ForwardTo: "http://127.0.0.1:1/", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	small := a.newCapture(SourceTunnel, "POST", "/x", nil, []byte("{}"))
	large := a.newCapture(SourceTunnel, "POST", "/x", nil, make([]byte, 1<<20))
	https := a.newCapture(SourceTunnel, "POST", "/x", nil, []byte("{}"))
	https.Target = "https://example.test/x"
	if p := a.choose(true, small); p != planQueued {
		t.Errorf("queued: plan %d", p)
	}
	if p := a.choose(false, small); p != planAlone || a.cm.live.Load() != 1 {
		t.Errorf("first live: plan %d, %d live", p, a.cm.live.Load())
	}
	if p := a.choose(false, small); p != planAlongside || a.cm.live.Load() != 2 {
		t.Errorf("second live: plan %d, %d live", p, a.cm.live.Load())
	}
	a.cm.live.Store(0)
	if p := a.choose(false, large); p != planAlongside {
		t.Errorf("large body alone: plan %d", p)
	}
	a.cm.live.Store(0)
	if p := a.choose(false, https); p != planAlongside {
		t.Errorf("https target alone: plan %d", p)
	}
	a.cm.live.Store(0)
	a.cm.saveFailed(errors.New("full"))
	if p := a.choose(false, small); p != planSaveFirst || a.cm.live.Load() != 0 {
		t.Errorf("saves failing: plan %d, %d live", p, a.cm.live.Load())
	}
	a.laneFor("").waiting.Store(1)
	if p := a.choose(false, small); p != planInTurn {
		t.Errorf("turns waiting: plan %d", p)
	}
	a.cm.answers.timer.Stop()
}

// A live request waiting for its turn is answered "queued" ahead of the
// relay's forward timeout: half of it, three seconds at most.
func TestDeferMargin(t *testing.T) {
	for ft, want := range map[time.Duration]time.Duration{
		time.Second:      500 * time.Millisecond,
		6 * time.Second:  3 * time.Second,
		30 * time.Second: 3 * time.Second,
	} {
		if got := deferMargin(ft); got != want {
			t.Errorf("deferMargin(%s) = %s, want %s", ft, got, want)
		}
	}
}

// An update committed through the queue is told to the inspector, as an
// answer is; a write with neither (Flush's) tells nothing.
func TestCommittedUpdatesArePublished(t *testing.T) {
	d := openDisk(t)
	cm, _ := runCommitter(t, d)
	c := testCapture(`{}`)
	if err := cm.commitInline(c); err != nil {
		t.Fatal(err)
	}
	marked := *c
	marked.Queued = true
	if err := cm.save(context.Background(), writeOp{update: &marked}); err != nil {
		t.Fatal(err)
	}
	if err := cm.save(context.Background(), writeOp{}); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.published) != 1 || d.published[0] != &marked {
		t.Errorf("published %d captures, want the update alone", len(d.published))
	}
}

// A request's capture starts pending, with one attempt allowed and no
// duration yet (-1: the console and the UI show "-"), its path and query
// apart, and its target under the handler's base.
func TestNewCapture(t *testing.T) {
	d := openDisk(t)
	a, err := New(Config{Store: d.store, ForwardTo: "http://127.0.0.1:1/base", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.cm.answers.timer.Stop()
	c := a.newCapture(SourceTunnel, "POST", "/hook?x=1", nil, []byte("{}"))
	if c.Status != agentdb.StatusPending || c.MaxAttempts != 1 || c.Duration != -1 || c.Path != "/hook" || c.Query != "x=1" ||
		c.Target != "http://127.0.0.1:1/base/hook?x=1" || c.ID == "" || c.Error != "" {
		t.Errorf("new capture: %+v", c)
	}
	if out := a.newCapture(SourceTunnel, "POST", "/a/../b", nil, nil); out.Target != "" || out.Error != errOutsideBase {
		t.Errorf("a path out of the base: target %q, error %q", out.Target, out.Error)
	}
}
