// Package relay is the public server of calltap's tunnel (Server): it gives
// each developer a stable URL and hands what senders send there to the
// agent holding the tunnel. The agent's side of the connection is
// relay/tunnel, the protocol between them relay/wire, carried by
// relay/frameconn; relay/cluster makes several relays act as one, and
// relay/certs gives them HTTPS.
//
// A sender's request to /t/<tunnel-id>/<rest> crosses one websocket to the
// agent holding that tunnel; while no agent holds it the request waits in
// the relay's SQLite queue and is delivered, in order, when one connects.
package relay

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaystate"
	"github.com/gorilla/websocket"
)

// Offline modes: what the relay does with a request for a tunnel whose agent
// is away.
const (
	OfflineQueue  = "queue"  // keep it and answer 202
	OfflineReject = "reject" // answer 503 with Retry-After: the sender retries
)

// Config is everything a Server needs. Zero values take the defaults below.
type Config struct {
	Store     Store   // tokens and the offline queue
	Cluster   Cluster // the other relay nodes sharing Store; nil for a single node
	PublicURL string  // base URL senders use, without trailing slash
	Version   string
	Logger    *slog.Logger

	ForwardTimeout time.Duration // 30 s: waiting for the local handler → 504
	MaxBody        int64         // 10 MiB → 413
	MaxHeaderBytes int           // 64 KiB → 431
	MaxFrame       int64         // MaxBody + 1 MiB
	Keepalive      frameconn.Keepalive
	AuthTimeout    time.Duration // 10 s: an agent (or anyone) must finish its request head by then

	Offline       string        // OfflineQueue (default) or OfflineReject
	QueueMaxCount int           // per tunnel, 10,000
	QueueMaxBytes int64         // per tunnel, 256 MiB
	QueueMaxAge   time.Duration // 72 h: the service gives up after ~42 min; people come back after a weekend

	RateLimit   float64 // requests per second per tunnel, 50
	RateBurst   int     // 200
	NoRateLimit bool    // no per-tunnel rate limit: RateLimit and RateBurst are not used
	MaxInFlight int     // concurrent live requests per tunnel, 256

	// A body is read before its request takes one of the MaxInFlight
	// places, so a slow sender holds only its own connection. It must
	// arrive at MinBodyRate bytes/s on average once BodyGrace has passed,
	// or the sender gets 408. A body still arriving after BodyGrace takes
	// one of the tunnel's MaxSlowBodies places, and a sender that finds
	// none free gets 408 too: slow senders crowd out only each other. The
	// bodies a tunnel reads at once are so bounded: those within their
	// grace by the rate limit (RateBurst + RateLimit × BodyGrace; by the
	// connections alone with NoRateLimit), the others by MaxSlowBodies;
	// each holds at most MaxBody.
	BodyGrace     time.Duration // 2 s
	MinBodyRate   int64         // 16 KiB/s
	MaxSlowBodies int           // per tunnel, 32

	// A sender refused before its body was read whole (429, 408, 413,
	// and any other refusal) is answered at once and its connection is
	// closed. What it still sends is read and dropped first, for up to
	// LingerTime (and at most 2 s of silence) and LingerBytes: a
	// lingering close, as nginx does, so that a client that writes its
	// whole body before it reads gets its answer instead of a reset.
	LingerTime  time.Duration // 10 s
	LingerBytes int64         // 64 MiB

	NoticeInterval time.Duration // 1 s: at most one refusal notice per tunnel per interval

	// Several agents on one token, each by what it claims (claims.go).
	MaxClaims  int           // 64: claims registered per token, every seat's
	ClaimTTL   time.Duration // 7 days: a seat away this long is released
	CallMemory time.Duration // 24 h: a call's seat is forgotten this long after its last event
}

// DefaultConfig is the Config a Server runs with when no field is set:
// the defaults of `calltap relay`'s flags.
func DefaultConfig() Config { return Config{}.withDefaults() }

// defaultTo sets *v to d when it is zero or negative: not set.
func defaultTo[T int | int64 | float64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// withDefaults gives every zero (or negative) field its default; see the
// comments on Config.
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Offline == "" {
		c.Offline = OfflineQueue
	}
	c.Keepalive = c.Keepalive.WithDefaults()
	// What one request may be, and how long its parts may take.
	defaultTo(&c.ForwardTimeout, 30*time.Second)
	defaultTo(&c.AuthTimeout, 10*time.Second)
	defaultTo(&c.MaxBody, 10<<20)
	defaultTo(&c.MaxHeaderBytes, 64<<10)
	defaultTo(&c.MaxFrame, c.MaxBody+1<<20)
	// What an offline tunnel keeps.
	defaultTo(&c.QueueMaxCount, 10000)
	defaultTo(&c.QueueMaxBytes, 256<<20)
	defaultTo(&c.QueueMaxAge, 72*time.Hour)
	// What one tunnel's senders may ask of the relay at once.
	defaultTo(&c.RateLimit, 50)
	defaultTo(&c.RateBurst, 200)
	defaultTo(&c.MaxInFlight, 256)
	defaultTo(&c.BodyGrace, 2*time.Second)
	defaultTo(&c.MinBodyRate, 16<<10)
	defaultTo(&c.MaxSlowBodies, 32)
	defaultTo(&c.LingerTime, 10*time.Second)
	defaultTo(&c.LingerBytes, 64<<20)
	defaultTo(&c.NoticeInterval, time.Second)
	defaultTo(&c.MaxClaims, 64)
	defaultTo(&c.ClaimTTL, 7*24*time.Hour)
	defaultTo(&c.CallMemory, 24*time.Hour)
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	return c
}

// Server is the public relay. It is an http.Handler; Run does its
// background work (queue expiry, revocation checks).
type Server struct {
	cfg      Config // Cluster is set: the other nodes', or a soloNode
	log      *slog.Logger
	upgrader websocket.Upgrader
	// shared is set when other nodes share Store: the queue's count is
	// then the store's, and this node's count of a tunnel it does not
	// hold is only an estimate.
	shared bool

	mu      sync.Mutex         // guards tunnels and closing
	tunnels map[string]*tunnel // guarded by mu; by tunnel id
	closing bool               // guarded by mu
	conns   sync.WaitGroup     // agent connections, each with its loops; added to under mu while !closing

	// Stopping in stages (Serve): draining refuses new requests; busy
	// counts the tunnel requests being answered, from senders here or
	// from other nodes; abandon ends once the grace for them is over.
	draining atomic.Bool
	busy     atomic.Int64
	abandon  context.Context
	giveUp   context.CancelFunc

	// seatsMu is held while a token's claimant seats are replaced
	// (tunnel.seats): by an agent registering its claims, and by the
	// registry's sync. Lock order: seatsMu, then mu.
	seatsMu sync.Mutex
	calls   callCache // which seat each recent call is with (claims.go)

	metrics metrics
}

// tunnel is one agent's seat on a token. A token's stable endpoint is its
// default seat, whose id is the tunnel id of the URL: senders reach it, and
// it holds what is the token's (its limits, what senders must present, its
// claimant seats). A claimant's seat (claims.go) is a tunnel of its own,
// id <tunnel id>-<claim set key>, with its own agent and queue.
type tunnel struct {
	id   string
	name string

	base    *tunnel   // the token's default seat; the tunnel itself for the default
	claims  claim.Set // what this seat claims; empty for the default
	created time.Time // when the seat was first registered: the earlier of two matching seats gets a call
	// seats are the token's claimant seats, oldest first, replaced whole
	// (syncSeats, registerSeat); nil on a claimant's seat. A token with
	// none pays nothing for claims.
	seats     atomic.Pointer[[]*tunnel]
	delivered atomic.Int64 // requests this seat's agents saved, for /metrics
	missing   int          // guarded by Server.seatsMu: reads of the registry in a row that lacked this seat

	// recounting is held across recount's read of the shared queue and
	// its write of queued. Lock order: recounting, then mu.
	recounting sync.Mutex

	mu          sync.Mutex         // guards the fields marked so below; after recounting
	agent       *agentConn         // guarded by mu; nil while no agent holds the tunnel
	taking      int                // guarded by mu; agents between their hold and taking the tunnel (serveConnect)
	newest      wire.Instance      // guarded by mu; the latest-started agent run let in: an older one is refused (takeover.go)
	queued      int                // guarded by mu; rows in the offline queue, counting inserts under way
	queuedBytes int64              // guarded by mu
	storing     int                // guarded by mu; inserts under way, counted in queued
	require     []wire.HeaderField // guarded by mu; set by the agent holding (or last holding) the tunnel
	limiter     tokenBucket        // guarded by mu

	// Refusals reach the agent as a count, at most one notice per
	// noticeEvery: a flood of refused senders must not become a flood of
	// frames (and console lines) on the developer's laptop.
	noticeEvery time.Duration
	noticedAt   time.Time // guarded by mu; when the last refusal notice went
	noticeDue   bool      // guarded by mu; a notice is scheduled and will carry the latest count

	inflight   chan struct{} // semaphore of live requests
	slowBodies chan struct{} // semaphore of bodies still arriving after the grace
	rejected   atomic.Int64  // senders refused by require
	kick       chan struct{} // cap 1: wakes the drain loop after an enqueue
}

// Store is what a relay keeps: tokens (only their hashes) and the offline
// queue. storage/relaydb keeps them in one SQLite file for a single
// node; relay/cluster keeps them in NATS JetStream for several.
type Store interface {
	Authenticate(ctx context.Context, token string) (*relaystate.Token, error)
	TunnelLive(ctx context.Context, tunnelID string) (bool, error)
	RevokedTunnels(ctx context.Context) (map[string]bool, error)

	// Enqueue returns once r is stored for good, with r.Seq set.
	Enqueue(ctx context.Context, r *relaystate.QueuedRequest) error
	// QueuedAfter returns up to limit requests of tunnelID with a Seq
	// above after, in the order they were stored.
	QueuedAfter(ctx context.Context, tunnelID string, after int64, limit int) ([]*relaystate.QueuedRequest, error)
	Dequeue(ctx context.Context, seqs ...int64) error
	QueueStatsByTunnel(ctx context.Context) (map[string]relaystate.QueueStats, error)
	TunnelQueueStats(ctx context.Context, tunnelID string) (relaystate.QueueStats, error)
	ExpireQueued(ctx context.Context, cutoff time.Time) (int64, error)

	// Claimants are the seats of tokens several agents share (claims.go).
	// SaveClaimant registers c, or updates its SeenAt and Connected: a
	// seat keeps the CreatedAt of its first registration.
	SaveClaimant(ctx context.Context, c *relaystate.Claimant) error
	// Claimants returns every registered seat of every token. In a
	// cluster it is read from a mirror: no round trip.
	Claimants(ctx context.Context) ([]*relaystate.Claimant, error)
	// ReleaseClaimant removes a seat and its queue, and returns how many
	// queued requests went with it; ErrNotFound for no such seat.
	ReleaseClaimant(ctx context.Context, seat string) (int, error)

	// RememberCall records that rec.CallID of rec.TunnelID belongs to
	// rec.Seat, unless the call is known already: then its record keeps
	// its seat and takes rec.Last. It returns the seat the call belongs
	// to. Of two nodes remembering one call at once, one seat wins, for
	// both.
	RememberCall(ctx context.Context, rec relaystate.CallRecord) (string, error)
	// CallSeat returns the seat of a known call; ErrNotFound otherwise.
	CallSeat(ctx context.Context, tunnelID, callID string) (string, error)
	// ExpireCalls forgets the calls whose last event came before cutoff.
	ExpireCalls(ctx context.Context, cutoff time.Time) (int64, error)
	// CallsSince counts, by seat, the calls first seen at or after since.
	CallsSince(ctx context.Context, since time.Time) (map[string]int, error)
}

// TunnelURL is where senders reach a tunnel.
func (s *Server) TunnelURL(tunnelID string) string { return s.cfg.PublicURL + "/t/" + tunnelID }

// readTimeout bounds reading a whole request, from its head to the end of
// the wait for the agent's answer (the server watches the connection for a
// sender going away meanwhile).
func (s *Server) readTimeout() time.Duration { return s.cfg.ForwardTimeout + 30*time.Second }

// refuseStopping answers a request the relay cannot take or finish as it
// stops: its sender retries, and reaches another node or this one restarted.
func (s *Server) refuseStopping(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "2")
	s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay is restarting; retry"))
}

const (
	expireEvery = 10 * time.Second
	// revokeEvery is short because `relay token revoke` is another
	// process: the relay learns of it from the database, and a developer
	// revoking a leaked token expects its agent gone at once.
	revokeEvery = 500 * time.Millisecond
)

// dropRevoked sends away the agents of revoked tokens and forgets their
// tunnels, whose URLs then answer 404.
func (s *Server) dropRevoked(ctx context.Context) {
	revoked, err := s.cfg.Store.RevokedTunnels(ctx)
	if err != nil {
		s.log.Error("read revoked tokens", "err", err)
		return
	}
	for id := range revoked {
		s.dropTunnel(id)
	}
}

// dropTunnel sends away the agent of a revoked token and forgets its
// tunnel, whose URL then answers 404.
func (s *Server) dropTunnel(id string) {
	s.mu.Lock()
	t := s.tunnels[id]
	s.mu.Unlock()
	if t != nil {
		for _, st := range t.claimants() {
			s.sendAway(st.id, true, wire.GoAway{Reason: wire.GoAwayRevoked, Message: "the token of this tunnel was revoked"})
		}
	}
	s.sendAway(id, true, wire.GoAway{Reason: wire.GoAwayRevoked, Message: "the token of this tunnel was revoked"})
}

// sendAway tells the agent holding tunnel id here, if any, to go, and
// forgets the tunnel if forget is set.
func (s *Server) sendAway(id string, forget bool, g wire.GoAway) {
	s.mu.Lock()
	t := s.tunnels[id]
	if forget {
		delete(s.tunnels, id)
	}
	s.mu.Unlock()
	if t == nil {
		return
	}
	t.mu.Lock()
	ac := t.agent
	t.mu.Unlock()
	if ac != nil {
		ac.goAway(g)
	}
}

func (s *Server) resyncQueueCounts(ctx context.Context) {
	stats, err := s.cfg.Store.QueueStatsByTunnel(ctx)
	if err != nil {
		return
	}
	for _, t := range s.snapshotTunnels() {
		st := stats[t.id]
		t.mu.Lock()
		t.queued, t.queuedBytes = st.Count, st.Bytes
		t.mu.Unlock()
	}
}

func (s *Server) snapshotTunnels() []*tunnel {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*tunnel, 0, len(s.tunnels))
	for _, t := range s.tunnels {
		out = append(out, t)
	}
	return out
}

// sendAgentsAway tells every agent the relay is going away, and returns
// once every agent connection and its loops have ended.
func (s *Server) sendAgentsAway() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	for _, t := range s.snapshotTunnels() {
		t.mu.Lock()
		ac := t.agent
		t.mu.Unlock()
		if ac != nil {
			ac.goAway(wire.GoAway{Reason: wire.GoAwayShutdown, Message: "relay shutting down"})
		}
	}
	s.conns.Wait()
}

// lookupTunnel returns the tunnel with id, loading it from the token table
// the first time; nil when no live token owns id.
func (s *Server) lookupTunnel(ctx context.Context, id string) (*tunnel, error) {
	s.mu.Lock()
	t := s.tunnels[id]
	s.mu.Unlock()
	if t != nil {
		return t, nil
	}
	if tunnelID, _, isSeat := strings.Cut(id, "-"); isSeat {
		return s.lookupSeat(ctx, tunnelID, id)
	}
	if !validTunnelID(id) {
		return nil, nil
	}
	live, err := s.cfg.Store.TunnelLive(ctx, id)
	if err != nil || !live {
		return nil, err
	}
	return s.tunnelFor(id, ""), nil
}

// tunnelFor returns the token's default seat, made the first time.
func (s *Server) tunnelFor(id, name string) *tunnel {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tunnels[id]
	if t == nil {
		t = s.newTunnel(id, name)
		t.base = t
		s.tunnels[id] = t
	}
	if name != "" && name != t.name {
		// A token's name is fixed: written only when it differs (a
		// tunnel first seen by its id alone), it races no reader when
		// one token's agents connect at once.
		t.name = name
	}
	return t
}

// newTunnel is a seat with nothing held yet.
func (s *Server) newTunnel(id, name string) *tunnel {
	return &tunnel{
		id:          id,
		name:        name,
		inflight:    make(chan struct{}, s.cfg.MaxInFlight),
		slowBodies:  make(chan struct{}, s.cfg.MaxSlowBodies),
		kick:        make(chan struct{}, 1),
		limiter:     tokenBucket{rate: s.cfg.RateLimit, burst: float64(s.cfg.RateBurst), tokens: float64(s.cfg.RateBurst), last: time.Now()},
		noticeEvery: s.cfg.NoticeInterval,
	}
}

func validTunnelID(id string) bool {
	if len(id) < 16 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

// fail writes an error envelope and counts it.
func (s *Server) fail(w http.ResponseWriter, e *api.Error) {
	s.metrics.countStatus(e.Status)
	api.WriteError(w, e)
}
