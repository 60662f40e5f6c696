package agent_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage/agentdb"
)

// stackOptions shape a stack.
type stackOptions struct {
	ForwardTo      string                                   // the local handler
	ForwardTimeout time.Duration                            // the peer's (the relay's): 30 s when 0
	PeerLog        *slog.Logger                             // what the peer logs; nowhere when nil
	Logger         *slog.Logger                             // the agent's and its client's; nowhere when nil
	Agent          func(*agent.Config)                      // adjusts the agent's config
	NewAgent       func(agent.Config) (*agent.Agent, error) // builds the agent; agent.New when nil
}

// stack is an agent, with its store in the test's directory, connected by
// its tunnel client to a peer playing the relay: what the agent's tests
// drive it through.
type stack struct {
	t         testing.TB
	opts      stackOptions
	dir       string
	peer      *peer
	TunnelURL string // where senders post

	mu      sync.Mutex
	stop    func() // guarded by mu: stops the agent; nil while none runs
	Agent   *agent.Agent
	AgentDB *agentdb.AgentStore
}

// startStack starts a peer and an agent connected to it, stopped by
// t.Cleanup.
func startStack(t testing.TB, opts stackOptions) *stack {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.NewAgent == nil {
		opts.NewAgent = agent.New
	}
	p := newPeer(t, opts.ForwardTimeout, opts.PeerLog)
	s := &stack{t: t, opts: opts, dir: t.TempDir(), peer: p, TunnelURL: p.url}
	t.Cleanup(s.StopAgent)
	s.StartAgent()
	return s
}

// StartAgent opens the store, starts the agent and its tunnel client, and
// waits until the tunnel is connected.
func (s *stack) StartAgent() {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	db, err := agentdb.OpenAgent(ctx, filepath.Join(s.dir, "agent.db"), agentdb.WithIntake())
	if err != nil {
		s.t.Fatal(err)
	}
	// The agent as calltap listen runs it: it resumes what an earlier
	// run saved but did not send.
	cfg := agent.Config{Store: db, ForwardTo: s.opts.ForwardTo, Logger: s.opts.Logger, ForwardTimeout: 10 * time.Second, ResumeQueued: true}
	if s.opts.Agent != nil {
		s.opts.Agent(&cfg)
	}
	a, err := s.opts.NewAgent(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	c, err := tunnel.NewClient(tunnel.Config{RelayURL: s.peer.hs.URL, Token: "test", Handler: a, Logger: s.opts.Logger,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, OnState: a.SetConnState})
	if err != nil {
		s.t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx) })
	wg.Go(func() { c.Run(ctx) })
	s.mu.Lock()
	s.Agent, s.AgentDB = a, db
	s.stop = func() {
		cancel()
		wg.Wait()
		db.Close()
	}
	s.mu.Unlock()
	polltest.Until(s.t, 10*time.Second, func() bool {
		return a.TunnelState().State == tunnel.StateConnected
	}, "the agent did not connect to the peer")
}

// StopAgent stops the agent: its client leaves the peer, which queues what
// comes next.
func (s *stack) StopAgent() {
	s.mu.Lock()
	stop := s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}
