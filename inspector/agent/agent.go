// Package agent is calltap's agent: it saves every request that reaches
// the tunnel in SQLite, forwards it to the developer's local handler,
// records the answer, and replays, backfills and saves the media of what
// it captured (with a mediasave.Saver, which downloads them).
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
//
// # Locks across packages
//
// The answer path nests locks of four packages, always in this order and
// never the other way; a lock not listed is taken alone (Agent: stopMu,
// lanesMu, lane.mu, stateMu, notifyMu; committer: replyMu, stopMu;
// CallMemory.mu, which is never held across its read of the store):
//
//	agent       committer.mu          held across a commit (commit, committer.go)
//	  agentdb     intakeLog.mu        held by LogCaptures for a whole append (intake.go)
//	    searchindex Indexer.mu        Touch, under intakeLog.mu, briefly (searchindex/indexer.go)
//	  inspector   hub.mu              committedAnswer → Agent.publish → the inspector's
//	                                  Server.publish → hub.publish, under committer.mu
//	agentdb     intakeLog.applyMu     held by an apply (applyLoop, or a reader catching up)
//	  agentdb     intakeLog.mu        briefly, to take the pending records
//	  searchindex Indexer.mu          WaitRoom and Saved, briefly
//	  agentdb     writeGate, rawMu    the store's one write connection (writer.go)
//
// The answer path's two chains meet only at the store's files: an apply
// runs on the intake log's goroutine, never under committer.mu. No lock
// is held across a write to the relay: frameconn's Conn.writeMu is taken by
// ackAll and finishAll (exchange.go) after every lock above is let go, and
// the Frame.Written callbacks it runs take none of them.
package agent

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/inspector/agent/mediasave"
	"github.com/calltap/calltap/inspector/routes"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage/agentdb"
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
	Store          *agentdb.AgentStore
	ForwardTo      string        // the local handler's base URL; may be empty for replay-only use, or with Routes (then requests no route takes are stored only)
	Routes         *routes.Table // the route file's (--routes, --events); nil: every request goes to ForwardTo. SetRoutes replaces it.
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

// Event is what the agent tells whoever shows its work as it happens (the
// inspector's live stream). Exactly one field is set. Its pointers are the
// agent's: valid only during the call that passes them.
type Event struct {
	Capture *agentdb.Capture   // a capture just committed
	Media   *agentdb.MediaFile // a media file's record just changed
	Tunnel  *TunnelState       // the relay connection's state just changed
}

// Agent captures, forwards and replays requests. A tunnel request's life
// is an exchange (exchange.go), served by the plan the committer's state
// picks for it (tunnel.go); the committer (committer.go) saves it, and
// the turn line (turns.go) sends those that wait for their turn.
//
// Lock order: stopMu, lanesMu, a lane's mu, stateMu and notifyMu are
// each taken alone; the committer's own come after none of them (see
// committer).
type Agent struct {
	cfg       Config                        // set by New, then read-only
	store     *agentdb.AgentStore           // read-only
	loader    captureLoader                 // reads a saved request back for its turn: store (a test's by NewLoadingThrough); set by New, then read-only
	forwardTo *url.URL                      // nil when no local handler is configured; read-only
	client    *http.Client                  // https targets; read-only
	liveSaved liveSaved                     // relay ids of live captures committed lately (livecopy.go)
	handler   *handlerClient                // http targets: the local handler, usually; read-only
	log       *slog.Logger                  // read-only
	notifyMu  sync.Mutex                    // serialises OnEvent
	notify    atomic.Pointer[[]func(Event)] // added to by OnEvent (copied, never changed in place)

	cm *committer // saves captures and answers; set by New, then read-only

	// Where captures go (routing.go): the route file's table, nil without
	// one; swapped whole by SetRoutes (a reload), read by each capture.
	routes atomic.Pointer[routes.Table]

	// The turn lines (turns.go), a lane per route, each in arrival order:
	// a lane's line is owned by its turnLoop, which takes from its head;
	// any goroutine appends (addTurn).
	lanesMu      sync.Mutex
	lanes        map[string]*lane // guarded by lanesMu; a lane, once made, stays
	laneCtx      context.Context  // guarded by lanesMu: Run's, nil before Run; lanes made later start their loop with it
	lanesStopped bool             // guarded by lanesMu: set once draining, after which no lane loop starts
	laneLoops    sync.WaitGroup   // the lanes' loops; Run waits for them

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

	console *console         // nil when Config.Console is; read-only
	media   *mediasave.Saver // nil when MediaDir is empty; read-only

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

// Store is the agent's capture store.
func (a *Agent) Store() *agentdb.AgentStore { return a.store }

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

// SetConnState records the relay connection's state and tells the UI.
func (a *Agent) SetConnState(cs tunnel.ConnState) {
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
