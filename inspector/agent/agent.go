// Package agent is calltap's agent: it saves every request that reaches
// the tunnel in SQLite, forwards it to the developer's local handler,
// records the answer, and replays, backfills and saves the media of what
// it captured.
//
// What it guarantees: a sender's 2xx (or 202) means the request is saved.
// A live request goes to the handler while its capture commits, and its
// sender gets the handler's answer once both are done; should the agent
// crash in between, the sender gets a 5xx and retries, so the handler may
// see a request again, with the same delivery id (the capture of the
// retry is marked duplicate_of the first when that one was saved, and the
// first, its answer unrecorded, answer-unknown). While it cannot save (a
// full disk) it refuses live requests, 503 with Retry-After, before they
// reach the handler (the one in flight when a commit first fails is
// answered 503 outcome_unknown: the handler may have had it). An orderly
// stop loses nothing a crash would not, and on a full disk keeps the
// answers it could not record for the next start.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/storage"
)

// Sources of a capture.
const (
	SourceTunnel   = "tunnel"
	SourceReplay   = "replay"
	SourceBackfill = "backfill"
	SourceTrigger  = "trigger"
	SourceImport   = "import" // loaded from an export (calltap import)
)

// Config configures an Agent.
type Config struct {
	Store          *storage.AgentStore
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
}

// captureWriter commits captures and the answers recorded on them. The
// store is the agent's; a test's fails a commit as a full disk does
// (export_test.go).
type captureWriter interface {
	LogCaptures(ctx context.Context, inserts, updates []*storage.Capture) ([]storage.Written, error)
}

// Event is what the agent tells whoever shows its work as it happens (the
// inspector's live stream). Exactly one field is set. Its pointers are the
// agent's: valid only during the call that passes them.
type Event struct {
	Capture *storage.Capture   // a capture just committed
	Media   *storage.MediaFile // a media file's record just changed
	Tunnel  *TunnelState       // the relay connection's state just changed
}

// Agent captures, forwards and replays requests. A tunnel request's life
// is an exchange (exchange.go), served by the plan the committer's state
// picks for it (tunnel.go); the committer (committer.go) saves it, and
// the turn line (turns.go) sends those that wait for their turn.
//
// Lock order: stopMu, turnMu, stateMu and notifyMu are each taken alone;
// the committer's own come after none of them (see committer).
type Agent struct {
	cfg       Config                        // set by New, then read-only
	store     *storage.AgentStore           // read-only
	forwardTo *url.URL                      // nil when no local handler is configured; read-only
	client    *http.Client                  // https targets; read-only
	handler   *handlerClient                // http targets: the local handler, usually; read-only
	log       *slog.Logger                  // read-only
	notifyMu  sync.Mutex                    // serialises OnEvent
	notify    atomic.Pointer[[]func(Event)] // added to by OnEvent (copied, never changed in place)

	cm *committer // saves captures and answers; set by New, then read-only

	// The turn line (turns.go), in arrival order: owned by turnLoop, which
	// takes from its head; any goroutine appends (addTurn).
	turnMu   sync.Mutex
	turns    []*exchange   // guarded by turnMu: not yet taken by turnLoop, in arrival order
	turnWake chan struct{} // cap 1: wakes turnLoop
	waiting  atomic.Int64  // turns not done, the one at the handler included; 0 lets a live request go straight

	// Stopping, in stages (Run): draining is closed by Drain or when Run's
	// context ends; then closing is set, after which no task starts, and
	// the tasks are waited for while the committer still commits what they
	// queue; then its loop commits the rest and returns, and Run stops it,
	// after which nothing is queued.
	draining   chan struct{}
	drainOnce  sync.Once
	stopMu     sync.RWMutex
	closing    bool                       // guarded by stopMu
	tasks      sync.WaitGroup             // goroutines started by start and backgroundLoop
	background chan func(context.Context) // to backgroundLoop: work bounded by Run's context

	console *console    // nil when Config.Console is; read-only
	media   *MediaSaver // nil when MediaDir is empty; read-only

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
	cfg = withDefaults(cfg)
	a := &Agent{
		cfg:        cfg,
		store:      cfg.Store,
		log:        cfg.Logger,
		cm:         newCommitter(cfg.Store, cfg.Logger),
		turnWake:   make(chan struct{}, 1),
		draining:   make(chan struct{}),
		background: make(chan func(context.Context)),
		handler:    newHandlerClient(cfg.ForwardTimeout, cfg.MaxBody),
		client:     newHTTPSClient(cfg.ForwardTimeout),
		state:      TunnelState{ForwardTo: cfg.ForwardTo, State: relay.StateOffline},
	}
	a.cm.committedInsert, a.cm.publish = a.committedInsert, a.publish
	if cfg.ForwardTo != "" {
		u, err := ParseTarget(cfg.ForwardTo)
		if err != nil {
			return nil, err
		}
		a.forwardTo = u
	}
	if a.forwardTo != nil && cfg.ResumeQueued {
		a.resume()
	}
	if cfg.Console != nil {
		a.console = newConsole(cfg.Console)
	}
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

// withDefaults fills in cfg's unset fields.
func withDefaults(cfg Config) Config {
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
		cfg.AnalysisPendingAfter = callevent.DefaultAnalysisPendingAfter
	}
	return cfg
}

// newHTTPSClient is the client for https targets.
func newHTTPSClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil, // the handler is local: never through a proxy
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true, // forward bodies as they are
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// resume takes up what an earlier run left: answers it passed on but, its
// disk full, could only keep in the answer reserve; then a live request it
// saved but was killed before its handler's answer was recorded (whether
// its sender got the handler's answer is not known); then the queued
// requests it saved but stopped before sending, which take the first
// turns, before any request of this run can arrive.
func (a *Agent) resume() {
	a.recoverAnswers()
	if n, err := a.store.MarkInterrupted(context.Background(), errInterrupted); err != nil {
		a.log.Error("marking requests whose answer an earlier run did not record", "err", err)
	} else if n > 0 {
		a.log.Warn("requests whose answer an earlier run did not record are marked answer unknown", "count", n)
	}
	ids, err := a.store.UndeliveredQueued(context.Background())
	if err != nil {
		a.log.Error("reading undelivered queued requests", "err", err)
	}
	for _, id := range ids {
		a.addTurn(&exchange{plan: planQueued, saved: closedChan, id: id})
	}
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
func (a *Agent) Store() *storage.AgentStore { return a.store }

// Config is the agent's configuration, defaults filled in.
func (a *Agent) Config() Config { return a.cfg }

// OnEvent makes the agent tell f of every Event from now on, for as long
// as it lives. f is called on the agent's own goroutines, the capture path
// among them: it must not block, and must not keep the event's pointers.
func (a *Agent) OnEvent(f func(Event)) {
	a.notifyMu.Lock()
	defer a.notifyMu.Unlock()
	var fs []func(Event)
	if old := a.notify.Load(); old != nil {
		fs = append(fs, *old...)
	}
	fs = append(fs, f)
	a.notify.Store(&fs)
}

func (a *Agent) publish(ev Event) {
	if fs := a.notify.Load(); fs != nil {
		for _, f := range *fs {
			f(ev)
		}
	}
}

// Run runs the committer's loop, the in-order delivery worker and the background
// work (replays on the service's schedule, media downloads) until ctx
// ends; it returns once every goroutine the agent started has ended. It is
// called once.
//
// It stops in stages, so that a stop loses nothing a kill would not: the
// request at the handler in turn finishes (the others wait for the next
// run, in their order); requests at the handler out of turn finish too,
// within the handler timeout; what they wrote is committed; only then
// does the writer stop.
func (a *Agent) Run(ctx context.Context) error {
	writes, stopWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWrites()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		a.cm.loop(writes)
	}()
	stopDrain := context.AfterFunc(ctx, a.Drain)
	defer stopDrain()
	var loops sync.WaitGroup
	loops.Go(func() { a.turnLoop(ctx) })
	loops.Go(func() { a.backgroundLoop(ctx) })
	loops.Wait()
	a.stopMu.Lock()
	a.closing = true
	a.stopMu.Unlock()
	a.tasks.Wait() // their writes are still taken
	stopWrites()
	<-wrote
	a.cm.stop(a.spillAnswers) // answers a failing disk gave back: kept in the answer reserve for the next run
	if a.media != nil {
		a.media.Close(context.Background()) // cancels the downloads: they end soon
	}
	a.FlushConsole()
	a.handler.closeIdle()
	a.client.CloseIdleConnections()
	return nil
}

// Drain makes the agent take no more turns at the handler: the one at the
// handler finishes, live requests waiting for theirs are answered
// "queued" (their senders get 202) and, with the queued ones, are sent in
// their order on the next start. A stopping tunnel calls it first; Run
// calls it once its context ends.
func (a *Agent) Drain() {
	a.drainOnce.Do(func() { close(a.draining) })
}

// errInterrupted is the error recorded on a live request whose answer an
// earlier run never recorded: it was killed first. The answer is sent
// before it is recorded (the answer path waits for one sync, not two), so
// a kill just after the sender got it leaves it so.
const errInterrupted = "answer unknown: the agent stopped before the handler's answer was recorded; the handler may have had the request, and its sender may have got the handler's answer (if it got a 5xx instead, it sends the request again)"

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
	if a.closing {
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
	case <-a.cm.quit:
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

// committedInsert takes what the store assigned to a capture it just
// committed, and tells the inspector and the media saver, unless the
// relay sent a capture already saved again.
func (a *Agent) committedInsert(c *storage.Capture, w storage.Written) {
	c.Seq, c.ID, c.DuplicateOf = w.Seq, w.ID, w.DuplicateOf
	if w.Redelivered {
		return
	}
	a.publish(Event{Capture: c})
	if a.media != nil {
		a.media.SaveCapture(c) // returns at once
	}
}

// Settle waits, when answers are still waiting to be committed (see
// responses), until they are: readers of the store then see every
// answer the agent already sent back.
func (a *Agent) Settle(ctx context.Context) {
	if a.cm.unsettled.Load() > 0 {
		a.Flush(ctx)
	}
}

// Flush waits until every write queued before it is committed.
func (a *Agent) Flush(ctx context.Context) error { return a.cm.save(ctx, writeOp{}) }
