// Package agent is calltap's agent: it saves every request that reaches
// the tunnel in SQLite before anything else happens to it, forwards it to
// the developer's local handler, records the answer, and replays, backfills
// and saves the media of what it captured.
package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/storage"
	"github.com/google/uuid"
)

// Sources of a capture.
const (
	SourceTunnel   = "tunnel"
	SourceReplay   = "replay"
	SourceBackfill = "backfill"
	SourceTrigger  = "trigger"
)

// Config configures an Agent.
type Config struct {
	Store          *storage.DB
	ForwardTo      string        // the local handler's base URL; may be empty for replay-only use
	ForwardTimeout time.Duration // 30 s
	MaxBody        int64         // largest response body kept from the handler, 10 MiB
	Logger         *slog.Logger
	Console        io.Writer // one line per request; nil for none

	// MediaDir is where recordings and transcripts linked from call events
	// are saved before their signed links expire; empty disables saving.
	MediaDir string
	// AllowPrivateMedia lets media links point at loopback and private
	// addresses (the emulator, tests); off, a payload cannot make the agent
	// fetch from the developer's own network.
	AllowPrivateMedia bool
	// RewriteMedia points a replay's media links at the saved copies
	// (--rewrite-media), since the signed originals will have expired.
	RewriteMedia bool
	// ResumeQueued sends, at start, requests from the relay's offline queue
	// that an earlier run saved but stopped before sending (listen, dev).
	ResumeQueued bool
	// AnalysisPendingAfter is how long after call.ended a call without
	// call.analysis_completed is flagged; 0 means 15 minutes.
	AnalysisPendingAfter time.Duration

	// writeCaptures replaces Store.WriteCaptures in writeLoop; nil uses it.
	// Only tests set it (export_test.go), to make commits fail the way a
	// full disk does without needing one.
	writeCaptures func(ctx context.Context, inserts, updates []*storage.Capture) error
}

// Event is what the agent tells whoever shows its work as it happens (the
// inspector's live stream). Exactly one field is set. Its pointers are the
// agent's: valid only during the call that passes them.
type Event struct {
	Capture *storage.Capture   // a capture just committed
	Media   *storage.MediaFile // a media file's record just changed
	Tunnel  *TunnelState       // the relay connection's state just changed
}

// Agent captures, forwards and replays requests.
type Agent struct {
	cfg       Config
	store     *storage.DB
	forwardTo *url.URL       // nil when no local handler is configured
	client    *http.Client   // https targets
	handler   *handlerClient // http targets: the local handler, usually
	log       *slog.Logger
	onEvent   atomic.Pointer[func(Event)] // set by SetOnEvent; nil tells nobody

	ops       chan writeOp // to writeLoop
	unsettled atomic.Int64 // responses queued for writeLoop and not yet committed

	// Tunnel requests that reach the handler one at a time, in arrival
	// order: the relay's queued ones, those an earlier run saved but did
	// not send, and live ones that arrived behind them (turnLoop).
	turnMu   sync.Mutex
	turns    []*turn       // guarded by turnMu: not yet taken by turnLoop, in arrival order
	turnWake chan struct{} // cap 1: wakes turnLoop
	waiting  atomic.Int64  // turns not done, the one at the handler included; 0 lets a live request go straight

	// Stopping. Run closes quit once its context ends and writeLoop has
	// returned; then it sets stopped, after which nothing is queued for
	// writeLoop and no task starts, and waits for the tasks.
	quit       chan struct{}
	stopMu     sync.RWMutex
	stopped    bool                       // guarded by stopMu
	tasks      sync.WaitGroup             // goroutines started by start and backgroundLoop
	background chan func(context.Context) // to backgroundLoop: work bounded by Run's context

	console *console    // nil when Config.Console is
	media   *MediaSaver // nil when MediaDir is empty

	stateMu sync.Mutex
	state   TunnelState // guarded by stateMu
}

// TunnelState is what GET /api/v1/ext/tunnel/ answers.
type TunnelState struct {
	PublicURL    string `json:"public_url"`
	ForwardTo    string `json:"forward_to"`
	State        string `json:"state"`
	InspectorURL string `json:"inspector_url"`
	Rejected     int64  `json:"rejected"`
	Queued       int    `json:"queued"`
	Error        string `json:"error,omitempty"`
}

// errStopped is why a write or a replay is refused once Run has stopped.
var errStopped = errors.New("agent: stopped")

// New builds an agent over cfg.Store. It starts nothing: Run does.
func New(cfg Config) (*Agent, error) {
	if cfg.Store == nil {
		return nil, errors.New("agent: Config.Store is required")
	}
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = 30 * time.Second
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 10 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AnalysisPendingAfter <= 0 {
		cfg.AnalysisPendingAfter = 15 * time.Minute
	}
	if cfg.writeCaptures == nil {
		cfg.writeCaptures = cfg.Store.WriteCaptures
	}
	a := &Agent{
		cfg:        cfg,
		store:      cfg.Store,
		log:        cfg.Logger,
		ops:        make(chan writeOp, 1024),
		turnWake:   make(chan struct{}, 1),
		quit:       make(chan struct{}),
		background: make(chan func(context.Context)),
	}
	if cfg.ForwardTo != "" {
		u, err := ParseTarget(cfg.ForwardTo)
		if err != nil {
			return nil, err
		}
		a.forwardTo = u
	}
	if a.forwardTo != nil && cfg.ResumeQueued {
		// Queued requests saved by an earlier run that stopped before
		// sending them take the first turns, before any request of this
		// run can arrive.
		ids, err := a.store.UndeliveredLate(context.Background())
		if err != nil {
			a.log.Error("reading undelivered queued requests", "err", err)
		}
		for _, id := range ids {
			a.addTurn(&turn{saved: closedChan, id: id})
		}
	}
	a.handler = newHandlerClient(cfg.ForwardTimeout, cfg.MaxBody)
	a.client = &http.Client{
		Timeout: cfg.ForwardTimeout,
		Transport: &http.Transport{
			Proxy:               nil, // the handler is local: never through a proxy
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true, // forward bodies as they are
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if cfg.Console != nil {
		a.console = newConsole(cfg.Console)
	}
	a.state = TunnelState{ForwardTo: cfg.ForwardTo, State: relay.StateOffline}
	if cfg.MediaDir != "" {
		saver, err := NewMediaSaver(MediaConfig{
			DB: cfg.Store, Dir: cfg.MediaDir, AllowPrivate: cfg.AllowPrivateMedia, Logger: cfg.Logger,
			OnUpdate: func(f *storage.MediaFile) { a.publish(Event{Media: f}) },
		})
		if err != nil {
			return nil, err
		}
		a.media = saver
	}
	return a, nil
}

// ParseTarget checks a --forward-to or --to URL.
func ParseTarget(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("target %q: want an http(s) URL such as http://127.0.0.1:3000/webhooks", s)
	}
	return u, nil
}

// Store is the agent's capture store.
func (a *Agent) Store() *storage.DB { return a.store }

// Config is the agent's configuration, defaults filled in.
func (a *Agent) Config() Config { return a.cfg }

// SetOnEvent makes the agent tell f of every Event; nil tells nobody. f is
// called on the agent's own goroutines, the capture path among them: it
// must not block, and must not keep the event's pointers.
func (a *Agent) SetOnEvent(f func(Event)) {
	if f == nil {
		a.onEvent.Store(nil)
		return
	}
	a.onEvent.Store(&f)
}

func (a *Agent) publish(ev Event) {
	if f := a.onEvent.Load(); f != nil {
		(*f)(ev)
	}
}

// Run runs the writer, the in-order delivery worker and the background
// work (replays on the service's schedule, media downloads) until ctx
// ends; it returns once every goroutine the agent started has ended. It is
// called once.
func (a *Agent) Run(ctx context.Context) error {
	var loops sync.WaitGroup
	loops.Go(func() { a.turnLoop(ctx) })
	loops.Go(func() { a.backgroundLoop(ctx) })
	a.writeLoop(ctx)
	a.stop()
	loops.Wait()
	a.tasks.Wait() // their writes are refused now, so nothing holds them long
	if a.media != nil {
		a.media.Close(context.Background()) // cancels the downloads: they end soon
	}
	a.FlushConsole()
	a.handler.closeIdle()
	return nil
}

// stop ends the agent's intake once writeLoop has returned: writes queued
// from now on are refused, and those still in the queue are abandoned.
func (a *Agent) stop() {
	close(a.quit) // frees a queue call blocked on a full queue
	a.stopMu.Lock()
	a.stopped = true
	a.stopMu.Unlock()
	for {
		select {
		case op := <-a.ops:
			a.abandon([]writeOp{op}, errStopped)
		default:
			return
		}
	}
}

// start runs f on a goroutine of its own that Run waits for; false, and f
// is not run, once the agent has stopped.
func (a *Agent) start(f func()) bool {
	if !a.enter() {
		return false
	}
	go func() {
		defer a.tasks.Done()
		f()
	}()
	return true
}

// enter counts the calling goroutine among the tasks Run waits for, until
// it calls tasks.Done; false once the agent has stopped.
func (a *Agent) enter() bool {
	a.stopMu.RLock()
	defer a.stopMu.RUnlock()
	if a.stopped {
		return false
	}
	a.tasks.Add(1)
	return true
}

// backgroundLoop starts the work handed to goBackground, each on its own
// goroutine, with Run's context.
func (a *Agent) backgroundLoop(ctx context.Context) {
	for {
		select {
		case f := <-a.background:
			a.tasks.Add(1)
			go func() {
				defer a.tasks.Done()
				f(ctx)
			}()
		case <-ctx.Done():
			return
		}
	}
}

// goBackground has f run on a goroutine of its own with Run's context,
// which bounds it; it waits for Run to take f, or for ctx to end.
func (a *Agent) goBackground(ctx context.Context, f func(context.Context)) error {
	select {
	case a.background <- f:
		return nil
	case <-a.quit:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// FlushConsole writes console lines still held back.
func (a *Agent) FlushConsole() {
	if a.console != nil {
		a.console.flush()
	}
}

// writeOp is one insert or update for writeLoop, with what to do after the
// commit.
type writeOp struct {
	insert *storage.Capture
	update *storage.Capture
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

// writeLoop owns every capture write: it commits whatever queued up while
// the previous transaction ran in one transaction. The kept writes of a
// failed commit (writeOp.keep) go first into the next one, in their order,
// which is tried with the next write or after a pause, whichever comes
// first: a full disk that gets room again is used again by itself.
func (a *Agent) writeLoop(ctx context.Context) {
	const maxBatch = 256
	batch := make([]writeOp, 0, maxBatch)
	var (
		acks  []*relay.Stream
		kept  []writeOp     // of the last commit, which failed
		pause time.Duration // before trying them again
	)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	again := time.NewTimer(time.Hour)
	again.Stop()
	for {
		batch = append(batch[:0], kept...)
		kept = kept[:0]
		var wake <-chan time.Time
		if len(batch) > 0 {
			again.Reset(pause)
			wake = again.C
		}
		select {
		case op := <-a.ops:
			batch = append(batch, op)
		case <-wake:
		case <-ctx.Done():
			a.abandon(batch, ctx.Err())
			return
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
		if onlyResponses(batch) {
			// Nobody waits for a response to be recorded (the sender has
			// its answer), so it waits a moment for the next request's
			// insert and shares its commit: one commit per request, not
			// two. An insert or a Flush ends the wait at once.
			linger.Reset(responseLinger)
		wait:
			for len(batch) < maxBatch {
				select {
				case op := <-a.ops:
					batch = append(batch, op)
					if op.update == nil {
						break wait
					}
				case <-linger.C:
					break wait
				case <-ctx.Done():
					break wait
				}
			}
			linger.Stop()
		}
		var inserts, updates []*storage.Capture
		for _, op := range batch {
			if op.insert != nil {
				inserts = append(inserts, op.insert)
			}
			if op.update != nil {
				updates = append(updates, op.update)
			}
		}
		err := a.cfg.writeCaptures(context.WithoutCancel(ctx), inserts, updates)
		if err != nil {
			for _, op := range batch {
				if op.keep {
					kept = append(kept, op)
				}
			}
			pause = min(max(2*pause, minWritePause), maxWritePause)
			a.log.Error("saving captures", "err", err, "inserts", len(inserts), "updates", len(updates), "trying_again", len(kept), "in", pause)
		} else {
			pause = 0
		}
		for _, op := range batch {
			if op.update != nil && op.after == nil && (err == nil || !op.keep) {
				a.unsettled.Add(-1)
			}
		}
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
		for _, op := range batch {
			if err != nil && op.keep {
				continue // in kept
			}
			c := op.insert
			if c == nil {
				c = op.update
			}
			if err == nil && c != nil {
				if !c.Redelivered {
					a.publish(Event{Capture: c})
					if op.insert != nil && a.media != nil {
						a.media.SaveCapture(c) // returns at once
					}
				}
			}
			if op.after != nil {
				op.after(err)
			}
		}
	}
}

// responseLinger is how long a batch of recorded responses alone waits for
// an insert to share its commit.
const responseLinger = 5 * time.Millisecond

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
		if op.update != nil && op.after == nil {
			a.unsettled.Add(-1)
		}
		if op.after != nil {
			op.after(err)
		}
	}
}

// onlyResponses reports a batch of response updates that nobody waits on.
func onlyResponses(batch []writeOp) bool {
	for _, op := range batch {
		if op.insert != nil || op.update == nil || op.after != nil {
			return false
		}
	}
	return true
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
// responseLinger), until they are: readers of the store then see every
// response the agent already sent back.
func (a *Agent) Settle(ctx context.Context) {
	if a.unsettled.Load() > 0 {
		a.Flush(ctx)
	}
}

// Flush waits until every write queued before it is committed.
func (a *Agent) Flush(ctx context.Context) error { return a.save(ctx, writeOp{}) }

// ServeTunnel takes a request from the relay. It runs on the connection's
// read loop, so it only queues work.
//
// A live request is forwarded while its capture is committed, and the relay
// gets the handler's answer once both are done: the sender's answer still
// means the capture is saved, and the handler no longer waits for the
// commit. A queued request is saved and acknowledged, then forwarded in
// arrival order (turnLoop); so is a live request that arrives while any
// request before it still waits for the handler (serveInTurn).
func (a *Agent) ServeTunnel(req *relay.Request, s *relay.Stream) {
	c := a.newCapture(SourceTunnel, req.Method, req.URI, req.Header, req.Body)
	c.RelayID = req.ID
	if !req.Queued {
		if a.waiting.Load() == 0 {
			a.serveLive(c, req.Header, s)
		} else {
			a.serveInTurn(c, req, s)
		}
		return
	}
	c.Late = true
	c.ArrivedAt = time.UnixMicro(req.ArrivedAt).UTC()
	t := &turn{saved: make(chan struct{})}
	a.addTurn(t) // now, so that its place is its arrival, however long the save takes
	id := c.ID
	// The relay forgets a queued request once it is saved.
	a.insert(writeOp{insert: c, ack: s, keep: true, after: func(err error) {
		s.Release() // the body is read back from the store
		t.id, t.err = c.ID, err
		// The relay sent it again because our ack was lost: the first
		// copy has its turn. (A save tried again may find its own first
		// try, committed after all: that one keeps its id.)
		t.skip = c.Redelivered && c.ID != id
		close(t.saved)
	}})
}

// serveLive saves and forwards a live request side by side; see ServeTunnel.
func (a *Agent) serveLive(c *storage.Capture, h relay.Header, s *relay.Stream) {
	out := *c // what the forward reads: writeLoop owns c until its commit
	// The commit's outcome: nil if it failed, else the timer of the ack
	// the relay needs only if the handler is slow to answer (the response
	// of a live request tells the relay it was saved).
	saved := make(chan *time.Timer, 1)
	a.insert(writeOp{insert: c, after: func(err error) {
		if err != nil {
			saved <- nil
			return
		}
		saved <- time.AfterFunc(liveAckDelay, s.Ack)
	}})
	// The goroutine ends within the forward timeout, once the commit's
	// outcome is known: writeLoop, or Run's stop, tells every queued write.
	started := a.start(func() {
		defer s.Release()
		res := a.send(context.Background(), &out, h, s.Limits())
		ack := <-saved
		if ack == nil {
			// The handler may have seen it; the sender, told it failed,
			// sends it again, and that one is saved.
			s.Respond(notSaved)
			return
		}
		ack.Stop()
		s.Respond(a.record(context.Background(), c, 1, res))
	})
	if !started { // the agent has stopped: the insert was refused too
		s.Respond(notSaved)
		s.Release()
	}
}

// notSaved is the answer to a live request whose capture could not be saved.
var notSaved = &relay.Response{Result: relay.ResultUnreachable, Error: "the agent could not save the request"}

// insert queues the insert of a tunnel request's capture; should the agent
// have stopped, op.after is told so at once.
func (a *Agent) insert(op writeOp) {
	c := op.insert
	if storage.KeptApart(len(c.Body)) {
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
		}
		return
	}
	a.queueInsert(op)
}

// queueInsert queues op, or tells op.after why it could not.
func (a *Agent) queueInsert(op writeOp) {
	if err := a.queue(context.Background(), op); err != nil {
		op.after(err)
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
	c         *storage.Capture // writeLoop's until saved
	out       storage.Capture  // what the forward reads
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
func (a *Agent) serveInTurn(c *storage.Capture, req *relay.Request, s *relay.Stream) {
	t := &turn{saved: make(chan struct{}), s: s, c: c, out: *c, h: req.Header,
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
}

// deferMargin is how long before the relay's forward timeout a live request
// still waiting for its turn is answered "queued": time for the answer to
// reach the relay.
func deferMargin(ft time.Duration) time.Duration { return min(ft/4, 2*time.Second) }

// deferTurn answers a live request still waiting for its turn "queued",
// once it is saved and marked late, so that a restart before its turn still
// sends it (UndeliveredLate).
func (a *Agent) deferTurn(t *turn) {
	if !t.state.CompareAndSwap(turnWaiting, turnDeferred) {
		return // turnLoop took it
	}
	defer close(t.answered)
	defer t.s.Release() // from now on the body is read back from the store
	<-t.saved           // comes: every queued write is told its outcome
	if t.err != nil {
		t.s.Respond(notSaved)
		return
	}
	late := *t.c
	late.Late, late.ArrivedAt = true, t.arrivedAt
	if err := a.save(context.Background(), writeOp{update: &late, keep: true}); err != nil {
		t.s.Respond(notSaved) // the agent is stopping
		return
	}
	t.queued = true
	t.s.Respond(&relay.Response{Result: relay.ResultQueued})
}

// turnLoop sends the tunnel's requests that must wait for their turn to the
// handler, one at a time, in arrival order.
func (a *Agent) turnLoop(ctx context.Context) {
	for {
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
				continue
			case <-ctx.Done():
				return
			}
		}
		a.takeTurn(ctx, t)
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
	select {
	case <-t.saved:
		if t.err != nil {
			t.s.Respond(notSaved) // its sender sends it again: the handler need not see it now
			return
		}
	default:
	}
	res := a.send(context.Background(), &t.out, t.h, t.s.Limits())
	select {
	case <-t.saved:
	case <-ctx.Done():
		return
	}
	if t.err != nil {
		t.s.Respond(notSaved)
		return
	}
	t.s.Respond(a.record(context.Background(), t.c, 1, res))
}

// newCapture builds a capture of a request and indexes it if it is a call event.
func (a *Agent) newCapture(source, method, uri string, h relay.Header, body []byte) *storage.Capture {
	path, query, _ := strings.Cut(uri, "?")
	hj, _ := h.MarshalJSON()
	c := &storage.Capture{
		ID:             newCaptureID(),
		Source:         source,
		CreatedAt:      time.Now().UTC(),
		Method:         method,
		Path:           path,
		Query:          query,
		RequestHeaders: string(hj),
		Body:           body,
		Status:         storage.StatusPending,
		MaxAttempts:    1,
		Duration:       -1,
	}
	indexCapture(c)
	if a.forwardTo != nil {
		if c.Target = joinTarget(a.forwardTo, path, query); c.Target == "" {
			c.Error = errOutsideBase
		}
	}
	return c
}

// errOutsideBase is the error recorded for a request whose path could lead
// out of the --forward-to base path; it is not sent.
const errOutsideBase = "refused: the path has a dot segment (. or ..) that could lead outside the --forward-to base path"

// newCaptureID makes a capture's id: a UUIDv7, whose leading timestamp
// keeps the store's unique index on id appending instead of scattering.
func newCaptureID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}

// joinTarget appends the path the sender used after the tunnel prefix to
// the local handler's URL; "" when the path has a dot segment in any
// encoding, which the handler (or a server before it) could resolve to a
// place outside the base path.
func joinTarget(base *url.URL, path, query string) string {
	if relay.HasDotSegment(path) {
		return ""
	}
	u := *base
	if path != "" && path != "/" {
		// path is as the sender escaped it; keep it so (an encoded slash
		// stays encoded) instead of escaping it a second time.
		raw := strings.TrimSuffix(base.EscapedPath(), "/") + path
		if p, err := url.PathUnescape(raw); err == nil {
			u.Path, u.RawPath = p, raw
		} else {
			u.Path, u.RawPath = raw, ""
		}
	}
	u.RawQuery = query
	return u.String()
}

// deliver sends c to its target once (attempt n), records the outcome and
// returns it in the relay's terms.
func (a *Agent) deliver(ctx context.Context, c *storage.Capture, n int) *relay.Response {
	return a.record(ctx, c, n, a.send(ctx, c, nil, relay.Limits{}))
}

// record writes attempt n's result res into c, queues its update, prints
// its console line and returns the response for the relay.
func (a *Agent) record(ctx context.Context, c *storage.Capture, n int, res sendResult) *relay.Response {
	c.Attempts = n
	c.Duration = res.duration
	c.DeliveredAt = time.Now().UTC()
	c.ResponseStatus = res.status
	c.ResponseHeaders = ""
	c.ResponseBody = nil
	if res.header != nil {
		hj, _ := res.header.MarshalJSON()
		c.ResponseHeaders = string(hj)
		c.ResponseBody = res.body
	}
	c.Error = res.err
	if res.status >= 200 && res.status < 300 {
		c.Status = storage.StatusDelivered
	} else if n >= c.MaxAttempts || !retryable(res) {
		c.Status = storage.StatusFailed
	} else {
		c.Status = storage.StatusPending
	}
	c.LastAttempt = &storage.Attempt{N: n, At: c.DeliveredAt.Add(-res.duration), ResponseStatus: res.status, Error: res.err, Duration: res.duration}
	// The sender is waiting for the answer, not for our bookkeeping: the
	// update commits with the next batch. A copy, since a retry may change
	// c before the batch runs.
	update := *c
	a.unsettled.Add(1)
	if a.queue(ctx, writeOp{update: &update, keep: true}) != nil {
		a.unsettled.Add(-1)
	}
	a.printLine(c)
	out := &relay.Response{Status: res.status, Header: res.header, Body: res.body, Error: res.err}
	switch {
	case res.timeout:
		out.Result = relay.ResultTimeout
	case res.tooLarge:
		out.Result = relay.ResultTooLarge
	case res.status == 0:
		out.Result = relay.ResultUnreachable
	}
	return out
}

// retryable is the voice service's rule (documentation 6.8).
func retryable(r sendResult) bool { return callevent.Retryable(r.status) }

// sendResult is one try at the local handler.
type sendResult struct {
	status   int
	header   relay.Header
	body     []byte
	err      string
	timeout  bool
	tooLarge bool // the handler answered, but more than can be passed on
	duration time.Duration
}

// send tries c's request at its target once. h is the request's headers
// when at hand (a live request), sparing a parse of the stored JSON; nil
// parses it. lim is what the relay takes in answer to a live request: an
// answer over it is not read past the limit and fails as too large.
func (a *Agent) send(ctx context.Context, c *storage.Capture, h relay.Header, lim relay.Limits) sendResult {
	start := time.Now()
	res := a.sendOnce(ctx, c, h, lim)
	res.duration = time.Since(start)
	if res.err == "" {
		if err := lim.Check(&relay.Response{Status: res.status, Header: res.header, Body: res.body}); err != nil {
			res = sendResult{err: err.Error(), tooLarge: true, duration: res.duration}
		}
	}
	return res
}

func (a *Agent) sendOnce(ctx context.Context, c *storage.Capture, h relay.Header, lim relay.Limits) sendResult {
	if c.Target == "" {
		if c.Error == errOutsideBase {
			return sendResult{err: c.Error}
		}
		return sendResult{err: "no local target: start the agent with --forward-to or replay with --to"}
	}
	req, err := http.NewRequestWithContext(ctx, c.Method, c.Target, bytes.NewReader(c.Body))
	if err != nil {
		return sendResult{err: err.Error()}
	}
	if h == nil {
		if err := h.UnmarshalJSON([]byte(c.RequestHeaders)); err != nil {
			return sendResult{err: "stored headers unreadable: " + err.Error()}
		}
	}
	for _, f := range h {
		switch http.CanonicalHeaderKey(f.Name) {
		case "Host":
			req.Header.Add("X-Forwarded-Host", f.Value)
			continue
		case "Content-Length", "Connection", "Keep-Alive", "Transfer-Encoding", "Te", "Upgrade", "Proxy-Connection", "Trailer":
			continue
		}
		req.Header.Add(f.Name, f.Value)
	}
	req.ContentLength = int64(len(c.Body))
	maxBody, whose := a.cfg.MaxBody, "agent"
	if lim.MaxBody > 0 && lim.MaxBody < maxBody {
		maxBody, whose = lim.MaxBody, "relay"
	}
	if req.URL.Scheme == "http" {
		resp, err := a.handler.doLimited(ctx, req, maxBody)
		if tl := (*bodyTooLargeError)(nil); errors.As(err, &tl) {
			return answerTooLarge(whose, maxBody)
		}
		if err != nil {
			return sendFailed("", err)
		}
		return sendResult{status: resp.status, header: relay.HeaderFrom(resp.header, ""), body: resp.body}
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return sendFailed("", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return sendFailed("reading the response: ", err)
	}
	if int64(len(body)) > maxBody {
		return answerTooLarge(whose, maxBody)
	}
	return sendResult{status: resp.StatusCode, header: relay.HeaderFrom(resp.Header, ""), body: body}
}

// answerTooLarge is the result of a try whose answer's body is over the
// limit of whose ("agent" or "relay").
func answerTooLarge(whose string, limit int64) sendResult {
	return sendResult{err: fmt.Sprintf("the handler's answer is larger than the %s's limit of %d bytes", whose, limit), tooLarge: true}
}

// sendFailed is the result of a try that got no answer; the client's
// *url.Error tells whether it timed out.
func sendFailed(prefix string, err error) sendResult {
	var ue *url.Error
	return sendResult{err: prefix + err.Error(), timeout: errors.As(err, &ue) && ue.Timeout()}
}

// SetConnState records the relay connection's state and tells the UI.
func (a *Agent) SetConnState(cs relay.ConnState) {
	a.stateMu.Lock()
	a.state.State = cs.State
	if cs.Hello != nil {
		a.state.PublicURL = cs.Hello.PublicURL
	}
	a.state.Rejected = cs.Notice.Rejected
	a.state.Queued = cs.Notice.Queued
	a.state.Error = ""
	if cs.Err != nil {
		a.state.Error = cs.Err.Error()
	}
	st := a.state
	a.stateMu.Unlock()
	a.publish(Event{Tunnel: &st})
}

// SetInspectorURL records where the inspector listens.
func (a *Agent) SetInspectorURL(u string) {
	a.stateMu.Lock()
	a.state.InspectorURL = u
	a.stateMu.Unlock()
}

// TunnelState returns the current state.
func (a *Agent) TunnelState() TunnelState {
	a.stateMu.Lock()
	defer a.stateMu.Unlock()
	return a.state
}
