package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/calltap/calltap/inspector/agent/mediasave"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage/agentdb"
)

// The agent's life: New builds it, Run runs it until its context ends and
// stops it in stages, Drain ends the turn line's work early.

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
		loader:     cfg.Store,
		cm:         newCommitter(cfg.Store, cfg.Logger),
		lanes:      map[string]*lane{},
		draining:   make(chan struct{}),
		background: make(chan func(context.Context)),
		handler:    newHandlerClient(cfg.ForwardTimeout, cfg.MaxBody),
		client:     newHTTPSClient(cfg.ForwardTimeout),
		state:      TunnelState{ForwardTo: cfg.ForwardTo, State: tunnel.StateOffline},
	}
	a.cm.committedInsert = a.committedInsert
	a.cm.committedAnswer = func(c *agentdb.Capture) { a.publish(Event{Capture: c}) }
	if cfg.ForwardTo != "" {
		u, err := ParseTarget(cfg.ForwardTo)
		if err != nil {
			return nil, err
		}
		a.forwardTo = u
	}
	a.routes.Store(cfg.Routes)
	if (a.forwardTo != nil || cfg.Routes != nil) && cfg.ResumeQueued {
		a.resume()
	}
	if cfg.Console != nil {
		a.console = newConsole(cfg.Console)
	}
	if cfg.MediaDir != "" {
		saver, err := mediasave.New(mediasave.Config{
			DB: cfg.Store, Dir: cfg.MediaDir, AllowPrivate: cfg.AllowPrivateMedia, Logger: cfg.Logger,
			OnUpdate: func(f *agentdb.MediaFile) { a.publish(Event{Media: f}) },
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
	left, err := a.store.UndeliveredQueued(context.Background())
	if err != nil {
		a.log.Error("reading undelivered queued requests", "err", err)
	}
	for _, u := range left {
		a.addTurn(&exchange{plan: planQueued, saved: closedChan, id: u.ID, route: u.Route})
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
	a.runLanes(ctx)
	loops.Go(a.stopLanes)
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

// FlushConsole writes console lines still held back.
func (a *Agent) FlushConsole() {
	if a.console != nil {
		a.console.flush()
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
	if c.RelayID != "" && !c.Queued {
		a.liveSaved.add(c.RelayID)
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

// recoverAnswers records the answers an earlier run kept in the answer
// reserve (spillAnswers), and makes the reserve for this run.
func (a *Agent) recoverAnswers() {
	if n, err := a.store.RecoverAnswers(context.Background()); err != nil {
		a.log.Warn("answers an earlier run kept in the answer reserve are not recorded yet; the next start tries again", "err", err)
	} else if n > 0 {
		a.log.Info("answers an earlier run could not record for want of room are recorded", "count", n)
	}
	if err := a.store.ReserveAnswers(); err != nil {
		a.log.Warn("no answer reserve: answers a full disk leaves unrecorded at the stop will be lost", "err", err)
	}
}

// spillAnswers keeps the answers a failing disk left unrecorded at the
// stop in the answer reserve, which needs no room, for the next run to
// record: their senders have them, and the store is to say so.
func (a *Agent) spillAnswers(caps []*agentdb.Capture) {
	if len(caps) == 0 {
		return
	}
	n, err := a.store.SpillAnswers(caps)
	if n > 0 {
		a.log.Warn("answers not recorded for want of room are kept in the answer reserve; the next start records them", "count", n)
	}
	if n < len(caps) {
		a.log.Error("answers lost: their captures will say answer unknown", "count", len(caps)-n, "err", err)
	}
}
