// Package stacktest starts a whole calltap stack in one process for
// tests: a relay, an agent connected to it through a real websocket, and the
// inspector's HTTP server, each on its own 127.0.0.1:0 socket with SQLite in
// the test's temporary directory. Nothing is mocked.
package stacktest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage/agentdb"
	"github.com/calltap/calltap/storage/relaydb"
)

// Options shape a Stack.
type Options struct {
	ForwardTo string              // the local handler
	Dir       string              // data directory; default t.TempDir()
	Relay     func(*relay.Config) // adjust the relay's config
	Agent     func(*agent.Config)
	NewAgent  func(agent.Config) (*agent.Agent, error) // builds the agent; default agent.New
	Client    func(*tunnel.Config)
	Assets    http.Handler // the UI, for browser tests
	Routes    []func(*http.ServeMux)
	NoAgent   bool // start without an agent (StartAgent later)
	Logger    *slog.Logger
	TokenName string
}

// Stack is a running relay + agent + inspector.
type Stack struct {
	t    testing.TB
	opts Options
	Dir  string

	RelayDB   *relaydb.Store
	Relay     *relay.Server
	RelayAddr string // host:port, stable across RestartRelay
	RelayURL  string
	Token     string
	TunnelID  string
	TunnelURL string

	mu           sync.Mutex
	relayStop    func()
	agentStop    func()
	Agent        *agent.Agent
	AgentDB      *agentdb.AgentStore
	InspectorURL string
	States       chan tunnel.ConnState // every state change of the agent's client
	ClientErr    chan error            // what the client's Run returned
}

// Start brings a stack up and registers its shutdown with t.Cleanup.
func Start(t testing.TB, opts Options) *Stack {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.TokenName == "" {
		opts.TokenName = "alice"
	}
	s := &Stack{t: t, opts: opts, Dir: opts.Dir}
	ctx := context.Background()
	db, err := relaydb.Open(ctx, filepath.Join(opts.Dir, "relay.db"))
	if err != nil {
		t.Fatal(err)
	}
	s.RelayDB = db
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.RelayAddr = ln.Addr().String()
	s.RelayURL = "http://" + s.RelayAddr
	info, err := relay.CreateToken(ctx, db, opts.TokenName, s.RelayURL)
	if err != nil {
		t.Fatal(err)
	}
	s.Token, s.TunnelID, s.TunnelURL = info.Token, info.TunnelID, info.URL
	s.startRelay(ln)
	if !opts.NoAgent {
		s.StartAgent()
	}
	t.Cleanup(s.Close)
	return s
}

func (s *Stack) startRelay(ln net.Listener) {
	s.t.Helper()
	cfg := relay.Config{Store: s.RelayDB, PublicURL: s.RelayURL, Logger: s.opts.Logger, Version: "test"}
	if s.opts.Relay != nil {
		s.opts.Relay(&cfg)
	}
	srv, err := relay.NewServer(context.Background(), cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hs := srv.HTTPServer(s.RelayAddr)
	done := make(chan struct{}, 2)
	go func() { srv.Run(ctx); done <- struct{}{} }()
	go func() { hs.Serve(ln); done <- struct{}{} }()
	s.mu.Lock()
	s.Relay = srv
	s.relayStop = func() {
		cancel() // Run tells agents the relay is going away
		<-done
		hs.Close() // and this drops every connection, websockets included
		<-done
	}
	s.mu.Unlock()
}

// StopRelay shuts the relay down (its database stays open).
func (s *Stack) StopRelay() {
	s.mu.Lock()
	stop := s.relayStop
	s.relayStop = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// StartRelay starts the relay again on the same address.
func (s *Stack) StartRelay() {
	s.t.Helper()
	var ln net.Listener
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err = net.Listen("tcp", s.RelayAddr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the port is released asynchronously
	}
	if err != nil {
		s.t.Fatal(err)
	}
	s.startRelay(ln)
}

// StartAgent starts the agent and its inspector and waits until the tunnel
// is connected.
func (s *Stack) StartAgent() {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	db, err := agentdb.OpenAgent(ctx, filepath.Join(s.Dir, "agent.db"), agentdb.WithIntake())
	if err != nil {
		s.t.Fatal(err)
	}
	acfg := agent.Config{Store: db, ForwardTo: s.opts.ForwardTo, Logger: s.opts.Logger, ForwardTimeout: 10 * time.Second, ResumeQueued: true}
	if s.opts.Agent != nil {
		s.opts.Agent(&acfg)
	}
	newAgent := agent.New
	if s.opts.NewAgent != nil {
		newAgent = s.opts.NewAgent
	}
	a, err := newAgent(acfg)
	if err != nil {
		s.t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.Run(ctx) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	inspURL := "http://" + ln.Addr().String()
	a.SetInspectorURL(inspURL)
	hs := &http.Server{Handler: inspector.NewServer(inspector.ServerConfig{Agent: a, Assets: s.opts.Assets, Routes: s.opts.Routes})}
	wg.Add(1)
	go func() { defer wg.Done(); hs.Serve(ln) }()

	states := make(chan tunnel.ConnState, 1024)
	clientErr := make(chan error, 1)
	ccfg := tunnel.Config{RelayURL: s.RelayURL, Token: s.Token, Handler: a, Logger: s.opts.Logger,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnState: func(cs tunnel.ConnState) {
			a.SetConnState(cs)
			select {
			case states <- cs:
			default:
			}
		}}
	if s.opts.Client != nil {
		s.opts.Client(&ccfg)
	}
	c, err := tunnel.NewClient(ccfg)
	if err != nil {
		s.t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); clientErr <- c.Run(ctx) }()

	s.mu.Lock()
	s.Agent, s.AgentDB, s.InspectorURL, s.States, s.ClientErr = a, db, inspURL, states, clientErr
	s.agentStop = func() {
		cancel()
		hs.Close()
		wg.Wait()
		db.Close()
	}
	s.mu.Unlock()
	s.WaitConnected()
}

// WaitConnected waits until the agent reports a connected tunnel.
func (s *Stack) WaitConnected() {
	s.t.Helper()
	polltest.Until(s.t, 10*time.Second, func() bool {
		return s.Agent.TunnelState().State == tunnel.StateConnected
	}, "the agent did not connect to the relay")
}

// StopAgent stops the agent (the relay notices and starts queueing).
func (s *Stack) StopAgent() {
	s.mu.Lock()
	stop := s.agentStop
	s.agentStop = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Close stops everything.
func (s *Stack) Close() {
	s.StopAgent()
	s.StopRelay()
	s.RelayDB.Close()
}
