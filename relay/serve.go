// The relay's face: building a Server, routing its public paths to the
// rooms below (senders, agents, metrics), and running and stopping it.

package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// NewServer builds a relay over cfg.Store and loads the queue left by a
// previous run, so it drains when each agent comes back.
func NewServer(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("relay: Config.Store is required")
	}
	cfg = cfg.withDefaults()
	if cfg.Offline != OfflineQueue && cfg.Offline != OfflineReject {
		return nil, fmt.Errorf("relay: offline mode must be %q or %q", OfflineQueue, OfflineReject)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, tunnels: map[string]*tunnel{}, shared: cfg.Cluster != nil}
	if cfg.Cluster == nil {
		s.cfg.Cluster = soloNode{}
	}
	s.abandon, s.giveUp = context.WithCancel(context.Background())
	s.upgrader = websocket.Upgrader{
		Subprotocols:     []string{wire.Subprotocol},
		HandshakeTimeout: cfg.AuthTimeout,
		// Reads reuse the HTTP server's buffer; write buffers come from a
		// pool and are held only while a message is being written, so an
		// idle tunnel holds neither.
		WriteBufferSize: 64 << 10,
		WriteBufferPool: &sync.Pool{},
		// Agents are programs, not pages: a browser Origin has no business here.
		CheckOrigin: func(r *http.Request) bool { return r.Header.Get("Origin") == "" },
	}
	if err := s.awayOnStart(ctx); err != nil {
		return nil, fmt.Errorf("relay: read the registry of claims: %w", err)
	}
	s.syncSeats(ctx) // before the queues: claimants' queues are theirs
	stats, err := cfg.Store.QueueStatsByTunnel(ctx)
	if err != nil {
		return nil, fmt.Errorf("relay: read offline queue: %w", err)
	}
	for id, st := range stats {
		t, err := s.lookupTunnel(ctx, id)
		if err != nil || t == nil {
			continue
		}
		t.mu.Lock()
		t.queued, t.queuedBytes = st.Count, st.Bytes
		t.mu.Unlock()
	}
	return s, nil
}

// HTTPServer wraps the relay in an http.Server with the timeouts a public
// listener needs (slow clients, slowloris).
func (s *Server) HTTPServer(addr string) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           s,
		ReadHeaderTimeout: s.cfg.AuthTimeout,
		ReadTimeout:       s.readTimeout(),
		WriteTimeout:      s.cfg.ForwardTimeout + 30*time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// Run expires old queued requests and drops agents whose token was revoked,
// until ctx ends; then it tells every agent the relay is going away and
// returns once every agent connection and its loops have ended. It stops
// all at once: Serve stops in stages.
func (s *Server) Run(ctx context.Context) error {
	s.runBackground(ctx, ctx)
	s.sendAgentsAway()
	return nil
}

// runBackground does Run's work until ctx ends, and takes other nodes'
// requests until intake ends; it returns once both have ended.
func (s *Server) runBackground(ctx, intake context.Context) {
	clustered := make(chan error, 1)
	go func() { clustered <- s.serveClustered(intake) }()
	defer func() { <-clustered }()
	expire := time.NewTicker(expireEvery)
	defer expire.Stop()
	revoke := time.NewTicker(revokeEvery)
	defer revoke.Stop()
	// A seat is released within 1¼ of the claim TTL, however short it is
	// set; a week's is looked at with the queue's expiry.
	claims := time.NewTicker(min(expireEvery, max(s.cfg.ClaimTTL/4, revokeEvery)))
	defer claims.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-expire.C:
			s.expireQueued(ctx)
		case <-claims.C:
			s.expireClaims(ctx)
		case <-revoke.C:
			s.dropRevoked(ctx)
			s.syncSeats(ctx)
		}
	}
}

// Serve serves hs on ln and does Run's work until ctx ends or ln fails,
// then stops in stages, so that every sender gets its handler's answer,
// 202 for what is queued, or a 503 with Retry-After — never an answer no
// one gave:
//
//  1. intake stops: ln closes, other nodes no longer hand requests here,
//     and a request that still arrives (on a connection already open) is
//     answered 503 with Retry-After;
//  2. the requests in flight have up to grace to be answered; those still
//     waiting then are answered 503 with Retry-After (a sender retries);
//  3. the agents are sent away: they reconnect, to another node or to
//     this one restarted, and what is queued waits for them;
//  4. the background work ends, and with it the tunnels this node held
//     in a cluster are released. Whoever opened the Cluster closes it
//     after Serve returns: that drains the node's connection to the others.
func (s *Server) Serve(ctx context.Context, hs *http.Server, ln net.Listener, grace time.Duration) error {
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	intake, stopIntake := context.WithCancel(work)
	worked := make(chan struct{})
	go func() {
		defer close(worked)
		s.runBackground(work, intake)
	}()
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
	}

	s.draining.Store(true) // 1
	stopIntake()
	s.log.Info("relay stopping: requests in flight may take until the grace ends", "grace", grace)
	if !s.finish(hs, grace) { // 2
		n := s.busy.Load()
		s.giveUp()
		s.log.Warn("stop grace over: requests still in flight are answered 503", "requests", n)
		if !s.finish(hs, abandonWait) {
			hs.Close()
		}
	}
	s.sendAgentsAway() // 3
	stopWork()         // 4
	<-worked
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// abandonWait bounds, once the stop grace is over, the wait for the
// answers of the requests that were still in flight.
const abandonWait = 5 * time.Second

// finish waits, until wait has passed, for hs to have answered every
// request (hs.Shutdown closes its listeners first) and for other nodes'
// requests to be answered; false if wait ran out first.
func (s *Server) finish(hs *http.Server, wait time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if hs.Shutdown(ctx) != nil {
		return false
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for s.busy.Load() > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// ServeHTTP routes the relay's public paths.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/t/"):
		s.busy.Add(1)
		defer s.busy.Add(-1)
		if s.draining.Load() {
			s.refuseStopping(w)
			return
		}
		s.serveSender(w, r)
	case p == wire.ConnectPath:
		if s.draining.Load() {
			s.refuseStopping(w)
			return
		}
		s.serveConnect(w, r)
	case p == "/healthz":
		api.WriteData(w, http.StatusOK, "ok", map[string]any{"version": s.cfg.Version})
	case p == "/metrics":
		s.serveMetrics(w)
	case p == "/":
		api.WriteData(w, http.StatusOK, "calltap relay", map[string]any{"version": s.cfg.Version})
	default:
		api.WriteError(w, api.NotFound("path"))
	}
}
