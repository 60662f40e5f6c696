package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
	"github.com/calltap/calltap/storage/relaydb"
	"github.com/calltap/calltap/web"
)

// runApp opens, runs and closes app (dev and listen run an agentApp); an
// error is printed as the command's one line and exit 1.
func runApp(ctx context.Context, stdio Stdio, name string, app interface {
	Open(context.Context) error
	Run(context.Context) error
	Close() error
}) int {
	if err := app.Open(ctx); err != nil {
		return fail(stdio, name, err)
	}
	err := app.Run(ctx)
	if cerr := app.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(stdio, name, err)
	}
	return 0
}

// agentApp is what `calltap listen` and `calltap dev` run: the agent over
// its store, the inspector, the tunnel to a relay and, for dev, the relay
// itself on loopback. Open opens and builds every part, Run runs them until
// one ends or ctx does, and Close releases what Open opened — in that order,
// one application per command.
type agentApp struct {
	flags  *agentFlags
	stdio  Stdio
	log    *slog.Logger
	tunnel tunnel.Config // RelayURL and Token; for dev, set by Open

	// devRelay, for dev, is the relay to run in this process; Open fills
	// in its server.
	devRelay *devRelay

	lock       *dataLock // the data directory, held from Open to Close
	db         *agentdb.AgentStore
	calls      *agent.CallMemory // keeps a call's events on one route; nil without routes
	agent      *agent.Agent
	inspectLn  net.Listener
	inspectURL string
	inspectSrv *http.Server
}

// devRelay is the relay `calltap dev` runs beside its agent.
type devRelay struct {
	listen, publicURL string
	flags             relayFlags

	db  *relaydb.Store
	ln  net.Listener
	srv *relay.Server
}

// Open opens the stores and listeners and builds every part; on error,
// what it opened is closed.
func (app *agentApp) Open(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			app.Close()
		}
	}()
	f := app.flags
	// First: a second agent on the directory opens nothing in it.
	if app.lock, err = holdDataDir(f.dataDir, "calltap "+app.mode()+" --forward-to "+f.forwardTo, app.log); err != nil {
		return err
	}
	// An export masks what senders must present: it is their secret. Kept
	// only once the directory is this agent's, so a refused second agent
	// changes nothing in it.
	if err := inspector.RecordRequiredHeaders(f.dataDir, app.tunnel.RequireHeaders); err != nil {
		return err
	}
	if d := app.devRelay; d != nil {
		if err := d.open(ctx, f, app.log); err != nil {
			return err
		}
		app.tunnel.RelayURL = "http://" + d.ln.Addr().String()
		app.tunnel.Token, err = devToken(f.dataDir)
		if err != nil {
			return err
		}
		if _, err := relay.EnsureToken(ctx, d.db, "dev", app.tunnel.Token); err != nil {
			return err
		}
	}
	if app.db, err = agentDB(ctx, f.dataDir, agentdb.WithSync(f.sync.syncMode()), agentdb.WithIntake()); err != nil {
		return err
	}
	cfg := agent.Config{Store: app.db, ForwardTo: f.forwardTo, ForwardTimeout: f.forwardTimeout, Logger: app.log,
		MediaDir: filepath.Join(f.dataDir, "media"), AllowPrivateMedia: f.allowPrivate, RewriteMedia: f.rewriteMedia,
		AnalysisPendingAfter: f.pendingAfter, ResumeQueued: true}
	if f.routes.any() {
		app.calls = agent.NewCallMemory(app.db, app.log)
		if cfg.Routes, err = f.routes.load(app.calls); err != nil {
			return f.routes.flagError(err) // changed since the flags were checked
		}
	}
	if !f.quiet {
		cfg.Console = app.stdio.Out
	}
	if app.agent, err = agent.New(cfg); err != nil {
		return err
	}
	if f.inspect != "" {
		if app.inspectLn, err = net.Listen("tcp", f.inspect); err != nil {
			return fmt.Errorf("inspector: %w", err)
		}
		app.inspectURL = "http://" + app.inspectLn.Addr().String()
		app.agent.SetInspectorURL(app.inspectURL)
		srv := inspector.NewServer(inspector.ServerConfig{Agent: app.agent, Assets: web.Handler(), Version: version, AllowedHosts: f.inspectHosts, Token: f.inspectToken})
		app.inspectSrv = &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	}
	return nil
}

func (d *devRelay) open(ctx context.Context, f *agentFlags, log *slog.Logger) (err error) {
	if d.db, err = relayDB(ctx, f.dataDir, storage.WithSync(f.sync.syncMode())); err != nil {
		return err
	}
	if d.ln, err = net.Listen("tcp", d.listen); err != nil {
		return err
	}
	pub := d.publicURL
	if pub == "" {
		pub = "http://" + d.ln.Addr().String()
	}
	cfg := d.flags.config(d.db, pub)
	cfg.Logger = log
	d.srv, err = relay.NewServer(ctx, cfg)
	return err
}

// Run runs the tunnel, the inspector and (dev) the relay until one of
// them ends or ctx does. The agent runs until they have all stopped, so
// that what they handed it is saved before it stops.
func (app *agentApp) Run(ctx context.Context) error {
	agentCtx, stopAgent := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAgent()
	agentDone := make(chan struct{})
	go func() {
		defer close(agentDone)
		app.agent.Run(agentCtx)
	}()
	// A stop first drains the agent (the request at the handler finishes,
	// those waiting for their turn are answered "queued"), while the
	// tunnel tells the relay to send no more and waits for the answers.
	defer context.AfterFunc(ctx, app.agent.Drain)()
	parts := []func(context.Context) error{app.runTunnel, runRetention(app.db, app.flags.retention.retention(), app.log)}
	if rf := &app.flags.routes; rf.file != "" {
		parts = append(parts, rf.watch(app.agent, app.calls, app.log))
	}
	if app.inspectSrv != nil {
		parts = append(parts, serveHTTP(app.inspectSrv, app.inspectLn, httpGrace))
	}
	if d := app.devRelay; d != nil {
		hs := d.srv.HTTPServer(d.listen)
		parts = append(parts, func(ctx context.Context) error { return d.srv.Serve(ctx, hs, d.ln, d.flags.stopGrace) })
	}
	err := runParts(ctx, parts...)
	stopAgent()
	<-agentDone
	return err
}

// Close closes the listeners and stores Open opened.
func (app *agentApp) Close() error {
	var errs []error
	if app.inspectLn != nil {
		app.inspectLn.Close() // Run closed it already, unless Run never ran
	}
	if app.db != nil {
		errs = append(errs, app.db.Close())
	}
	if d := app.devRelay; d != nil {
		if d.ln != nil {
			d.ln.Close()
		}
		if d.db != nil {
			errs = append(errs, d.db.Close())
		}
	}
	// Last: the stores are closed, and the next agent may open them.
	errs = append(errs, app.lock.release())
	return errors.Join(errs...)
}

// mode is the command the app runs for: dev or listen.
func (app *agentApp) mode() string {
	if app.devRelay != nil {
		return "dev"
	}
	return "listen"
}

// runTunnel connects the agent to the relay and prints the banner once the
// first connection is up. It returns nil when ctx ends, and the reason
// when the relay will not have this agent any more (a revoked token).
func (app *agentApp) runTunnel(ctx context.Context) error {
	var once sync.Once
	refused := agent.NewRefusalReport(app.stdio.Out, agent.RefusalReportEvery)
	defer refused.Stop()
	cc := app.tunnel
	cc.Logger = app.log
	cc.Handler = app.agent
	cc.Claims = app.flags.claims
	// Live requests at the handler are answered within its timeout.
	cc.StopGrace = app.flags.forwardTimeout + 5*time.Second
	cc.OnState = func(s tunnel.ConnState) {
		app.agent.SetConnState(s)
		if s.State == tunnel.StateConnected && s.Hello != nil {
			once.Do(func() {
				b := agent.Banner{Command: app.mode(), Version: version, PublicURL: s.Hello.PublicURL, Destination: app.flags.destination(),
					InspectorURL: app.inspectURL, Claims: s.Hello.Claims, Queued: s.Hello.Queued}
				b.Print(app.stdio.Out)
			})
			refused.Note(s.Notice.Rejected)
		}
	}
	client, err := tunnel.NewClient(cc)
	if err != nil {
		return err
	}
	err = client.Run(ctx)
	if errors.Is(err, tunnel.ErrUnauthorized) {
		return fmt.Errorf("%v — check --token, or ask for a new one with 'calltap relay token create'", err)
	}
	return err
}

// devToken is the local token of `calltap dev`, kept in the data directory
// so the tunnel id (and URL) survive restarts.
func devToken(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "dev-token")
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var b [32]byte
	rand.Read(b[:])
	t := "ct_dev_" + base64.RawURLEncoding.EncodeToString(b[:])
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", err
	}
	return t, os.WriteFile(path, []byte(t+"\n"), 0o600)
}

// agentFlags are the agent's and inspector's settings, shared by listen and dev.
type agentFlags struct {
	forwardTo      string
	inspect        string
	inspectHosts   stringList
	inspectToken   string
	dataDir        string
	forwardTimeout time.Duration
	jsonLogs       bool
	quiet          bool
	rewriteMedia   bool
	allowPrivate   bool
	pendingAfter   time.Duration
	sync           syncFlag
	retention      retentionFlags
	routes         routeFlags
	claimExprs     stringList
	claims         claim.Set // claimExprs parsed, by validate
}

func (f *agentFlags) register(fs *flagSet) {
	fs.StringVar(&f.forwardTo, "forward-to", "", "the local handler's `url`, e.g. http://127.0.0.1:3000/webhooks (the rest of the tunnel path and the query are appended)")
	fs.StringVar(&f.inspect, "inspect", "127.0.0.1:4040", "`address` of the inspector (browser UI and JSON API); empty to disable")
	fs.Var(&f.inspectHosts, "inspect-host", "extra `host` name the inspector accepts, or its whole origin when a proxy serves it (https://name) (repeatable)")
	fs.StringVar(&f.inspectToken, "inspect-token", "", "`token` the inspector requires (needed to bind beyond loopback)")
	fs.StringVar(&f.dataDir, "data", defaultDataDir(), "data `dir`ectory: captures, saved media")
	fs.DurationVar(&f.forwardTimeout, "handler-timeout", 30*time.Second, "how long the local handler may take")
	fs.BoolVar(&f.jsonLogs, "log-json", false, "log as JSON")
	fs.BoolVar(&f.quiet, "quiet", false, "do not print a line per request")
	fs.BoolVar(&f.rewriteMedia, "rewrite-media", false, "replays point media links at the copies the agent saved (the signed originals expire)")
	fs.BoolVar(&f.allowPrivate, "allow-private-media", false, "let media links point at loopback or private addresses (on in dev)")
	fs.DurationVar(&f.pendingAfter, "analysis-pending-after", callevent.DefaultAnalysisPendingAfter, "flag a call whose call.analysis_completed has not come this long after call.ended")
	f.sync.register(fs)
	f.retention.register(fs)
	f.routes.register(fs)
	fs.Var(&f.claimExprs, "claim", "share the token: take only the calls whose first event matches `EXPR`, PATH=VALUE (a JSON dot path in\nthe body: call.variables.developer=alice) or header:NAME=VALUE; repeatable, any one matching claims a call (calltap help team)")
}

// validate checks the flags, in the order a reader meets them: where
// requests go, which requests are this agent's, and the inspector.
func (f *agentFlags) validate() error {
	for _, check := range []func() error{f.checkDestination, f.parseClaims, f.checkInspector} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// checkDestination checks --forward-to, --routes and --events.
func (f *agentFlags) checkDestination() error {
	if f.forwardTo == "" && !f.routes.any() {
		return errors.New("missing --forward-to URL (or --routes FILE)")
	}
	if _, err := agent.ParseTarget(f.forwardTo); err != nil && f.forwardTo != "" {
		return fmt.Errorf("--forward-to: %v", err)
	}
	if f.routes.any() {
		if _, err := f.routes.load(nil); err != nil {
			return f.routes.flagError(err)
		}
	}
	return nil
}

// parseClaims reads --claim into f.claims.
func (f *agentFlags) parseClaims() error {
	var err error
	if f.claims, err = claim.ParseSet(f.claimExprs); err != nil {
		// claim's errors begin "claim <expr>:", which names the flag too.
		return fmt.Errorf("--%v", err)
	}
	return nil
}

// checkInspector checks --inspect and --inspect-host: an inspector beyond
// loopback needs a token.
func (f *agentFlags) checkInspector() error {
	for _, h := range f.inspectHosts {
		if err := inspector.ValidInspectHost(h); err != nil {
			return fmt.Errorf("--inspect-host %v", err)
		}
	}
	if f.inspect == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(f.inspect)
	if err != nil {
		return fmt.Errorf("--inspect %q: want host:port", f.inspect)
	}
	ip := net.ParseIP(host)
	loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
	if !loopback && f.inspectToken == "" {
		return fmt.Errorf("--inspect %s is beyond loopback: set --inspect-token too", f.inspect)
	}
	return nil
}

// destination is where the banner says requests go.
func (f *agentFlags) destination() string {
	rest := f.forwardTo
	if rest == "" {
		rest = "stored only"
	}
	if f.routes.file != "" {
		return fmt.Sprintf("routes in %s; the rest: %s", f.routes.file, rest)
	}
	if f.routes.events != "" {
		return fmt.Sprintf("%s (only %s; the rest stored only)", rest, f.routes.events)
	}
	return rest
}
