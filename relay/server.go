// Package relay is both ends of calltap's tunnel: the public server that
// gives each developer a stable URL (Server), the agent's side of the
// connection (Client), and the wire protocol between them (protocol.go).
//
// A sender's request to /t/<tunnel-id>/<rest> crosses one websocket to the
// agent holding that tunnel; while no agent holds it the request waits in
// the relay's SQLite queue and is delivered, in order, when one connects.
package relay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
	"github.com/google/uuid"
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
	DB        *storage.DB
	PublicURL string // base URL senders use, without trailing slash
	Version   string
	Logger    *slog.Logger

	ForwardTimeout time.Duration // 30 s: waiting for the local handler → 504
	MaxBody        int64         // 10 MiB → 413
	MaxHeaderBytes int           // 64 KiB → 431
	MaxFrame       int64         // MaxBody + 1 MiB
	Keepalive      Keepalive
	AuthTimeout    time.Duration // 10 s: an agent (or anyone) must finish its request head by then

	Offline       string        // OfflineQueue (default) or OfflineReject
	QueueMaxCount int           // per tunnel, 10,000
	QueueMaxBytes int64         // per tunnel, 256 MiB
	QueueMaxAge   time.Duration // 72 h: the service gives up after ~42 min; people come back after a weekend

	RateLimit   float64 // requests per second per tunnel, 50
	RateBurst   int     // 200
	MaxInFlight int     // concurrent live requests per tunnel, 256

	// A body is read before its request takes one of the MaxInFlight
	// places, so a slow sender holds only its own connection. It must
	// arrive at MinBodyRate bytes/s on average once BodyGrace has passed,
	// or the sender gets 408. A body still arriving after BodyGrace takes
	// one of the tunnel's MaxSlowBodies places, and a sender that finds
	// none free gets 408 too: slow senders crowd out only each other. The
	// bodies a tunnel reads at once are so bounded: those within their
	// grace by the rate limit (RateBurst + RateLimit × BodyGrace), the
	// others by MaxSlowBodies; each holds at most MaxBody.
	BodyGrace     time.Duration // 2 s
	MinBodyRate   int64         // 16 KiB/s
	MaxSlowBodies int           // per tunnel, 32

	NoticeInterval time.Duration // 1 s: at most one refusal notice per tunnel per interval
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ForwardTimeout <= 0 {
		c.ForwardTimeout = 30 * time.Second
	}
	if c.MaxBody <= 0 {
		c.MaxBody = 10 << 20
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 64 << 10
	}
	if c.MaxFrame <= 0 {
		c.MaxFrame = c.MaxBody + 1<<20
	}
	c.Keepalive = c.Keepalive.withDefaults()
	if c.AuthTimeout <= 0 {
		c.AuthTimeout = 10 * time.Second
	}
	if c.Offline == "" {
		c.Offline = OfflineQueue
	}
	if c.QueueMaxCount <= 0 {
		c.QueueMaxCount = 10000
	}
	if c.QueueMaxBytes <= 0 {
		c.QueueMaxBytes = 256 << 20
	}
	if c.QueueMaxAge <= 0 {
		c.QueueMaxAge = 72 * time.Hour
	}
	if c.RateLimit <= 0 {
		c.RateLimit = 50
	}
	if c.RateBurst <= 0 {
		c.RateBurst = 200
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 256
	}
	if c.BodyGrace <= 0 {
		c.BodyGrace = 2 * time.Second
	}
	if c.MinBodyRate <= 0 {
		c.MinBodyRate = 16 << 10
	}
	if c.MaxSlowBodies <= 0 {
		c.MaxSlowBodies = 32
	}
	if c.NoticeInterval <= 0 {
		c.NoticeInterval = time.Second
	}
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	return c
}

// Server is the public relay. It is an http.Handler; Run does its
// background work (queue expiry, revocation checks).
type Server struct {
	cfg      Config
	log      *slog.Logger
	upgrader websocket.Upgrader

	mu      sync.Mutex
	tunnels map[string]*tunnel // guarded by mu; by tunnel id
	closing bool               // guarded by mu

	metrics metrics
}

// tunnel is one developer's stable endpoint.
type tunnel struct {
	id   string
	name string

	mu          sync.Mutex
	agent       *agentConn    // guarded by mu; nil while no agent holds the tunnel
	queued      int           // guarded by mu; rows in the offline queue, counting inserts under way
	queuedBytes int64         // guarded by mu
	require     []HeaderField // guarded by mu; set by the agent holding (or last holding) the tunnel
	limiter     tokenBucket   // guarded by mu

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

// NewServer builds a relay over cfg.DB and loads the queue left by a
// previous run, so it drains when each agent comes back.
func NewServer(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DB == nil {
		return nil, errors.New("relay: Config.DB is required")
	}
	cfg = cfg.withDefaults()
	if cfg.Offline != OfflineQueue && cfg.Offline != OfflineReject {
		return nil, fmt.Errorf("relay: offline mode must be %q or %q", OfflineQueue, OfflineReject)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, tunnels: map[string]*tunnel{}}
	s.upgrader = websocket.Upgrader{
		Subprotocols:     []string{Subprotocol},
		HandshakeTimeout: cfg.AuthTimeout,
		// Reads reuse the HTTP server's buffer; write buffers come from a
		// pool and are held only while a message is being written, so an
		// idle tunnel holds neither.
		WriteBufferSize: 64 << 10,
		WriteBufferPool: &sync.Pool{},
		// Agents are programs, not pages: a browser Origin has no business here.
		CheckOrigin: func(r *http.Request) bool { return r.Header.Get("Origin") == "" },
	}
	stats, err := cfg.DB.QueueStatsByTunnel(ctx)
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

// TunnelURL is where senders reach a tunnel.
func (s *Server) TunnelURL(tunnelID string) string { return s.cfg.PublicURL + "/t/" + tunnelID }

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

// readTimeout bounds reading a whole request, from its head to the end of
// the wait for the agent's answer (the server watches the connection for a
// sender going away meanwhile).
func (s *Server) readTimeout() time.Duration { return s.cfg.ForwardTimeout + 30*time.Second }

// Run expires old queued requests and drops agents whose token was revoked,
// until ctx ends; then it tells every agent the relay is going away.
func (s *Server) Run(ctx context.Context) error {
	expire := time.NewTicker(expireEvery)
	defer expire.Stop()
	revoke := time.NewTicker(revokeEvery)
	defer revoke.Stop()
	for {
		select {
		case <-ctx.Done():
			s.shutdown()
			return nil
		case <-expire.C:
			s.expireQueued(ctx)
		case <-revoke.C:
			s.dropRevoked(ctx)
		}
	}
}

const (
	expireEvery = 10 * time.Second
	// revokeEvery is short because `relay token revoke` is another
	// process: the relay learns of it from the database, and a developer
	// revoking a leaked token expects its agent gone at once.
	revokeEvery = 500 * time.Millisecond
)

func (s *Server) expireQueued(ctx context.Context) {
	if n, err := s.cfg.DB.ExpireQueued(ctx, time.Now().Add(-s.cfg.QueueMaxAge)); err != nil {
		s.log.Error("expire queue", "err", err)
	} else if n > 0 {
		s.log.Warn("dropped expired queued requests", "count", n, "max_age", s.cfg.QueueMaxAge)
		s.resyncQueueCounts(ctx)
	}
}

// dropRevoked sends away the agents of revoked tokens and forgets their
// tunnels, whose URLs then answer 404.
func (s *Server) dropRevoked(ctx context.Context) {
	revoked, err := s.cfg.DB.RevokedTunnels(ctx)
	if err != nil {
		s.log.Error("read revoked tokens", "err", err)
		return
	}
	for id := range revoked {
		s.mu.Lock()
		t := s.tunnels[id]
		delete(s.tunnels, id)
		s.mu.Unlock()
		if t == nil {
			continue
		}
		t.mu.Lock()
		ac := t.agent
		t.mu.Unlock()
		if ac != nil {
			ac.goAway(GoAway{Reason: GoAwayRevoked, Message: "the token of this tunnel was revoked"})
		}
	}
}

func (s *Server) resyncQueueCounts(ctx context.Context) {
	stats, err := s.cfg.DB.QueueStatsByTunnel(ctx)
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

func (s *Server) shutdown() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	for _, t := range s.snapshotTunnels() {
		t.mu.Lock()
		ac := t.agent
		t.mu.Unlock()
		if ac != nil {
			ac.goAway(GoAway{Reason: GoAwayShutdown, Message: "relay shutting down"})
		}
	}
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
	if !validTunnelID(id) {
		return nil, nil
	}
	live, err := s.cfg.DB.TunnelLive(ctx, id)
	if err != nil || !live {
		return nil, err
	}
	return s.tunnelFor(id, ""), nil
}

func (s *Server) tunnelFor(id, name string) *tunnel {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tunnels[id]
	if t == nil {
		t = &tunnel{
			id:          id,
			name:        name,
			inflight:    make(chan struct{}, s.cfg.MaxInFlight),
			slowBodies:  make(chan struct{}, s.cfg.MaxSlowBodies),
			kick:        make(chan struct{}, 1),
			limiter:     tokenBucket{rate: s.cfg.RateLimit, burst: float64(s.cfg.RateBurst), tokens: float64(s.cfg.RateBurst), last: time.Now()},
			noticeEvery: s.cfg.NoticeInterval,
		}
		s.tunnels[id] = t
	}
	if name != "" {
		t.name = name
	}
	return t
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

// HasDotSegment reports whether an escaped URL path has a "." or ".."
// segment in any spelling that a server on the way to the handler might
// decode into one: percent-encoded (once or more), split at an encoded
// slash or at a backslash, or with a ";" parameter after it. Such a path
// could climb out of the base path the agent forwards to.
func HasDotSegment(path string) bool {
	if !strings.ContainsAny(path, ".%") {
		return false // neither a dot nor an escape that could make one
	}
	for {
		if plainDotSegment(path) {
			return true
		}
		dec := unescapeLenient(path)
		if dec == path {
			return false
		}
		path = dec
	}
}

func plainDotSegment(path string) bool {
	for _, seg := range strings.FieldsFunc(path, func(r rune) bool { return r == '/' || r == '\\' }) {
		seg, _, _ = strings.Cut(seg, ";")
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// unescapeLenient decodes every valid %XX and keeps anything else as it
// is, so that one bad escape does not hide the others.
func unescapeLenient(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if hi, lo := unhex(s[i+1]), unhex(s[i+2]); hi >= 0 && lo >= 0 {
				b.WriteByte(byte(hi<<4 | lo))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// ServeHTTP routes the relay's public paths.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/t/"):
		s.serveTunnel(w, r)
	case p == ConnectPath:
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

// errorStatus writes an error envelope and counts it.
func (s *Server) fail(w http.ResponseWriter, e *api.Error) {
	s.metrics.countStatus(e.Status)
	api.WriteError(w, e)
}

func (s *Server) serveTunnel(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), "/t/")
	id, uri, _ := strings.Cut(rest, "/")
	uri = "/" + uri
	dotted := HasDotSegment(uri)
	if r.URL.RawQuery != "" {
		uri += "?" + r.URL.RawQuery
	}
	t, err := s.lookupTunnel(r.Context(), id)
	if err != nil {
		s.log.Error("tunnel lookup", "tunnel", id, "err", err)
		s.fail(w, api.Errorf(http.StatusInternalServerError, api.CodeInternal, "internal error"))
		return
	}
	if t == nil {
		s.fail(w, api.NotFound("tunnel"))
		return
	}
	// A logger per request, made only when something is logged: slog's
	// With formats its attributes at once, which a hot path cannot afford.
	log := reqLogger{s.log, t.id, ""}

	// Refused senders spend the tunnel's allowance too: refusing is work,
	// and a flood must be cut off by the rate limit whatever it carries.
	if wait, ok := t.allow(time.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		s.fail(w, api.Errorf(http.StatusTooManyRequests, api.CodeRateLimited, "too many requests for this tunnel"))
		return
	}
	t.mu.Lock()
	require := t.require
	t.mu.Unlock()
	for _, f := range require {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(f.Name)), []byte(f.Value)) != 1 {
			t.rejected.Add(1)
			t.notifyRefused()
			log.Info("sender refused: required header missing or wrong", "header", f.Name)
			s.fail(w, api.Errorf(http.StatusUnauthorized, api.CodeHeaderRejected, "the %s header is missing or wrong", f.Name))
			return
		}
	}
	if dotted {
		// The path is appended to the base path of the agent's local
		// handler: a "." or ".." segment could lead out of it.
		log.Info("sender refused: dot segment in the path", "uri", uri)
		s.fail(w, api.Invalid("the path after the tunnel id must not have a dot segment (. or ..), in any encoding"))
		return
	}
	if r.ContentLength > s.cfg.MaxBody {
		s.fail(w, api.Errorf(http.StatusRequestEntityTooLarge, api.CodeTooLarge, "body larger than %d bytes", s.cfg.MaxBody))
		return
	}
	buf, bodyErr := s.readBody(w, r, t)
	if bodyErr != nil {
		if bodyErr.Status == http.StatusRequestTimeout {
			w.Header().Set("Connection", "close")
			log.Info("slow sender cut off", "reason", bodyErr.Message)
		}
		s.fail(w, bodyErr)
		return
	}
	select {
	case t.inflight <- struct{}{}:
		defer func() { <-t.inflight }()
	default:
		putBuf(buf)
		w.Header().Set("Retry-After", "1")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "too many requests in flight for this tunnel"))
		return
	}
	s.metrics.bytesIn.Add(int64(buf.Len()))
	req := &Request{
		ID:        uuid.NewString(),
		ArrivedAt: time.Now().UnixMicro(),
		Method:    r.Method,
		URI:       uri,
		Header:    HeaderFrom(r.Header, r.Host),
		Body:      buf.Bytes(),
	}
	log.request = req.ID

	t.mu.Lock()
	ac := t.agent
	live := ac != nil && t.queued == 0
	t.mu.Unlock()
	if live {
		// The pooled buffer backs req.Body until the frame is written; the
		// round trip returns only after that.
		s.forward(w, r, t, ac, req, buf, log)
		return
	}
	defer putBuf(buf)
	s.enqueue(w, r.Context(), t, req, log)
}

// readBody reads a sender's body into a pooled buffer, holding the sender
// to Config.MinBodyRate after Config.BodyGrace and to one of the tunnel's
// places for slow bodies once the grace is over (see Config).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, t *tunnel) (*bytes.Buffer, *api.Error) {
	now := time.Now()
	p := &bodyPacer{body: r.Body, rc: http.NewResponseController(w), slowBodies: t.slowBodies,
		start: now, end: now.Add(s.readTimeout()), grace: s.cfg.BodyGrace, rate: float64(s.cfg.MinBodyRate)}
	var body io.Reader = p
	if p.rc.SetReadDeadline(p.deadline()) != nil {
		body = r.Body // a connection without deadlines cannot be paced
	} else {
		p.timer = time.AfterFunc(p.grace, p.graceOver)
	}
	buf, err := readAllPooled(body, s.cfg.MaxBody)
	cut := p.finish(err == nil)
	switch {
	case err == nil:
		return buf, nil // cut or not: it came whole
	case errors.Is(err, errTooLarge):
		return nil, api.Errorf(http.StatusRequestEntityTooLarge, api.CodeTooLarge, "body larger than %d bytes", s.cfg.MaxBody)
	case cut:
		return nil, api.Errorf(http.StatusRequestTimeout, api.CodeRequestTimeout,
			"the body was still arriving after %s and this tunnel is reading as many slow bodies as it may; send it faster or retry later", s.cfg.BodyGrace)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, api.Errorf(http.StatusRequestTimeout, api.CodeRequestTimeout,
			"the body arrived too slowly: it must come at %d bytes/s or more after the first %s, and all within %s", s.cfg.MinBodyRate, s.cfg.BodyGrace, s.readTimeout())
	default:
		return nil, api.Invalid("reading the body: %v", err)
	}
}

// bodyPacer reads a body, moving the connection's read deadline on as
// bytes arrive so that a sender must keep up the minimum rate. When the
// grace is over it takes one of the tunnel's places for slow bodies, or
// cuts the sender off at once if there is none.
type bodyPacer struct {
	body       io.Reader
	rc         *http.ResponseController
	slowBodies chan struct{}
	start, end time.Time // end: the read deadline never goes past it
	grace      time.Duration
	rate       float64 // bytes per second
	n          int64   // bytes read; only Read's goroutine touches it
	timer      *time.Timer

	mu   sync.Mutex
	slow bool // holds a place in slowBodies
	cut  bool // found no place: the deadline is past for good
	done bool
}

func (p *bodyPacer) Read(b []byte) (int, error) {
	n, err := p.body.Read(b)
	if n > 0 {
		p.n += int64(n)
		p.mu.Lock()
		if !p.cut {
			p.rc.SetReadDeadline(p.deadline())
		}
		p.mu.Unlock()
	}
	return n, err
}

// deadline is when the bytes read so far stop being enough.
func (p *bodyPacer) deadline() time.Time {
	d := p.start.Add(p.grace + time.Duration(float64(p.n)/p.rate*float64(time.Second)))
	if d.After(p.end) {
		return p.end
	}
	return d
}

// graceOver runs when the grace ends with the body still arriving.
func (p *bodyPacer) graceOver() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	select {
	case p.slowBodies <- struct{}{}:
		p.slow = true
	default:
		p.cut = true
		p.rc.SetReadDeadline(time.Now()) // wakes the blocked Read with a timeout
	}
}

// finish gives back the slow place, if taken, and leaves a connection
// whose body was read whole the deadline of the whole request (the server
// watches it while the agent answers). It reports whether the sender was
// cut off for want of a place.
func (p *bodyPacer) finish(whole bool) bool {
	if p.timer == nil {
		return false
	}
	p.timer.Stop()
	p.mu.Lock()
	p.done = true
	slow, cut := p.slow, p.cut
	p.mu.Unlock()
	if slow {
		<-p.slowBodies
	}
	if whole {
		p.rc.SetReadDeadline(p.end)
	}
	return cut
}

// forward sends a live request to the agent and relays its answer.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, t *tunnel, ac *agentConn, req *Request, buf *bytes.Buffer, log reqLogger) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ForwardTimeout)
	defer cancel()
	resp, acked, err := ac.roundTrip(ctx, req, buf)
	switch {
	case err == nil:
		defer resp.release()
	case errors.Is(err, errFrameTooLarge):
		// Written, it would have closed the websocket under every request in flight.
		log.Warn("request larger than the agent reads", "size", len(req.Body), "agent_max_frame", ac.peerMax.Load())
		s.fail(w, api.Errorf(http.StatusRequestEntityTooLarge, api.CodeTooLarge, "the request is larger than the agent accepts (%d bytes with its headers)", ac.peerMax.Load()))
		return
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		log.Warn("local handler too slow", "timeout", s.cfg.ForwardTimeout, "saved", acked)
		s.fail(w, api.Errorf(http.StatusGatewayTimeout, api.CodeGatewayTimeout, "the local handler did not answer within %s", s.cfg.ForwardTimeout))
		return
	case r.Context().Err() != nil:
		return // the sender went away
	case acked:
		log.Warn("agent lost after saving the request", "err", err)
		s.fail(w, api.Errorf(http.StatusBadGateway, api.CodeBadGateway, "the agent saved the request but disconnected before the local handler answered"))
		return
	default:
		log.Warn("agent lost before it confirmed saving the request", "err", err)
		w.Header().Set("Retry-After", "5")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeAgentOffline, "the agent disconnected before it confirmed saving the request; retry"))
		return
	}
	switch resp.Result {
	case ResultUnreachable:
		s.fail(w, api.Errorf(http.StatusBadGateway, api.CodeBadGateway, "the local handler could not be reached: %s", resp.Error))
		return
	case ResultTimeout:
		s.fail(w, api.Errorf(http.StatusGatewayTimeout, api.CodeGatewayTimeout, "the local handler did not answer in time"))
		return
	case ResultTooLarge:
		s.fail(w, api.Errorf(http.StatusBadGateway, api.CodeBadGateway, "the local handler's answer could not be relayed: %s", resp.Error))
		return
	case ResultQueued:
		log.Info("queued by the agent behind earlier requests", "method", req.Method, "uri", req.URI)
		s.answerQueued(w, req.ID, "queued: the agent saved the request and delivers it after the ones that arrived before it")
		return
	}
	h := w.Header()
	for _, f := range resp.Header {
		if hopByHop(f.Name) {
			continue
		}
		h.Add(f.Name, f.Value)
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	n, _ := w.Write(resp.Body)
	s.metrics.bytesOut.Add(int64(n))
	s.metrics.countStatus(resp.Status)
	log.Debug("forwarded", "method", req.Method, "uri", req.URI, "status", resp.Status)
}

// reqLogger logs with the tunnel and request ids.
type reqLogger struct {
	l       *slog.Logger
	tunnel  string
	request string // empty until the request has an id
}

func (l reqLogger) log(level slog.Level, msg string, args ...any) {
	if !l.l.Enabled(context.Background(), level) {
		return
	}
	args = append([]any{"tunnel", l.tunnel}, args...)
	if l.request != "" {
		args = append(args, "request", l.request)
	}
	l.l.Log(context.Background(), level, msg, args...)
}

func (l reqLogger) Debug(msg string, args ...any) { l.log(slog.LevelDebug, msg, args...) }
func (l reqLogger) Info(msg string, args ...any)  { l.log(slog.LevelInfo, msg, args...) }
func (l reqLogger) Warn(msg string, args ...any)  { l.log(slog.LevelWarn, msg, args...) }
func (l reqLogger) Error(msg string, args ...any) { l.log(slog.LevelError, msg, args...) }

func hopByHop(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te", "Trailer", "Content-Length":
		return true
	}
	return false
}

// enqueue keeps a request for an absent agent, or refuses it in reject mode.
func (s *Server) enqueue(w http.ResponseWriter, ctx context.Context, t *tunnel, req *Request, log reqLogger) {
	if s.cfg.Offline == OfflineReject {
		w.Header().Set("Retry-After", "30")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeAgentOffline, "no agent is connected to this tunnel; retry later"))
		return
	}
	head := appendHeader(nil, req.Header)
	size := int64(len(req.Body) + len(head) + len(req.URI))
	t.mu.Lock()
	if t.queued >= s.cfg.QueueMaxCount || t.queuedBytes+size > s.cfg.QueueMaxBytes {
		t.mu.Unlock()
		w.Header().Set("Retry-After", "60")
		log.Warn("offline queue full", "max_count", s.cfg.QueueMaxCount, "max_bytes", s.cfg.QueueMaxBytes)
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeQueueFull, "the offline queue of this tunnel is full; retry later"))
		return
	}
	// Reserve the place first, so a request arriving now also queues
	// behind this one instead of overtaking it.
	t.queued++
	t.queuedBytes += size
	t.mu.Unlock()
	err := s.cfg.DB.Enqueue(context.WithoutCancel(ctx), &storage.QueuedRequest{
		ID: req.ID, TunnelID: t.id, ArrivedAt: req.ArrivedAt, Method: req.Method, URI: req.URI, Headers: head, Body: req.Body,
	})
	if err != nil {
		t.mu.Lock()
		t.queued--
		t.queuedBytes -= size
		t.mu.Unlock()
		log.Error("enqueue", "err", err)
		w.Header().Set("Retry-After", "30")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the request could not be stored; retry later"))
		return
	}
	select {
	case t.kick <- struct{}{}:
	default:
	}
	log.Info("queued for offline agent", "method", req.Method, "uri", req.URI)
	s.answerQueued(w, req.ID, "queued: the agent is offline; the request will be delivered when it reconnects")
}

// answerQueued tells a sender its request is kept and will be delivered
// later: 202 with the request's id.
func (s *Server) answerQueued(w http.ResponseWriter, id, message string) {
	s.metrics.countStatus(http.StatusAccepted)
	api.WriteData(w, http.StatusAccepted, message, map[string]any{"id": id, "queued": true, "status": "queued"})
}

// allow takes a token from the tunnel's rate limiter.
func (t *tunnel) allow(now time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.limiter.take(now)
}

// notifyRefused tells the agent the count of refused senders: at once if
// no notice went in the last noticeEvery, else once that interval is over,
// with the count as it is then. Never blocks.
func (t *tunnel) notifyRefused() {
	now := time.Now()
	t.mu.Lock()
	if t.noticeDue {
		t.mu.Unlock()
		return
	}
	wait := t.noticedAt.Add(t.noticeEvery).Sub(now)
	if wait <= 0 {
		t.noticedAt = now
		t.mu.Unlock()
		t.notify()
		return
	}
	t.noticeDue = true
	t.mu.Unlock()
	time.AfterFunc(wait, func() {
		t.mu.Lock()
		t.noticeDue = false
		t.noticedAt = time.Now()
		t.mu.Unlock()
		t.notify()
	})
}

// notify sends the counters to the agent, if one is connected; never blocks.
func (t *tunnel) notify() {
	t.mu.Lock()
	ac := t.agent
	n := Notice{Rejected: t.rejected.Load(), Queued: t.queued}
	t.mu.Unlock()
	if ac != nil {
		ac.trySend(outFrame{head: appendJSON(nil, frameNotice, n)})
	}
}

// tokenBucket is a plain token bucket; the caller holds the lock.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func (b *tokenBucket) take(now time.Time) (time.Duration, bool) {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second)), false
}

// serveConnect upgrades an agent's connection after checking its token.
func (s *Server) serveConnect(w http.ResponseWriter, r *http.Request) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		s.fail(w, api.Errorf(http.StatusUnauthorized, api.CodeUnauthorized, "missing bearer token"))
		return
	}
	tok, err := s.cfg.DB.Authenticate(r.Context(), token)
	if errors.Is(err, storage.ErrNotFound) {
		s.fail(w, api.Errorf(http.StatusUnauthorized, api.CodeUnauthorized, "token is not valid or was revoked"))
		return
	} else if err != nil {
		s.log.Error("authenticate", "err", err)
		s.fail(w, api.Errorf(http.StatusInternalServerError, api.CodeInternal, "internal error"))
		return
	}
	if !websocket.IsWebSocketUpgrade(r) {
		s.fail(w, api.Invalid("expected a websocket upgrade"))
		return
	}
	if !offers(r, Subprotocol) {
		s.fail(w, api.Invalid("this relay speaks %s; upgrade calltap", Subprotocol))
		return
	}
	var require []HeaderField
	for _, v := range r.Header.Values(RequireHeaderHeader) {
		name, value, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(name) == "" {
			s.fail(w, api.Invalid("%s must be 'Name: value'", RequireHeaderHeader))
			return
		}
		require = append(require, HeaderField{strings.TrimSpace(name), strings.TrimSpace(value)})
	}
	// An agent that does not say reads what calltap's agents always did.
	agentMax := int64(DefaultMaxFrame)
	if v := r.Header.Get(MaxFrameHeader); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			s.fail(w, api.Invalid("%s must be a positive number of bytes", MaxFrameHeader))
			return
		}
		agentMax = n
	}
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		w.Header().Set("Retry-After", "1")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "relay shutting down"))
		return
	}
	hw := &hijackBatch{ResponseWriter: w}
	ws, err := s.upgrader.Upgrade(hw, r, nil)
	if err != nil {
		return // the upgrader answered already
	}
	t := s.tunnelFor(tok.TunnelID, tok.Name)
	ac := &agentConn{
		wsConn:  newWSConn(ws, hw.bc, s.cfg.MaxFrame, s.cfg.Keepalive),
		srv:     s,
		t:       t,
		pending: map[uint64]*pending{},
		queued:  map[uint64]int64{},
		window:  make(chan struct{}, drainWindow),
		acked:   make(chan int64, drainWindow),
	}
	ac.setPeerMax(agentMax)
	t.mu.Lock()
	old := t.agent
	t.agent = ac
	t.require = require
	queued := t.queued
	t.mu.Unlock()
	if old != nil {
		old.goAway(GoAway{Reason: GoAwayReplaced, Message: "another agent connected with the same token and took over this tunnel"})
	}
	s.metrics.agentsConnected.Add(1)
	log := s.log.With("tunnel", t.id, "name", t.name)
	log.Info("agent connected", "remote", r.RemoteAddr, "queued", queued)
	go ac.sendLoop()
	ac.trySend(outFrame{head: appendJSON(nil, frameHello, Hello{
		TunnelID: t.id, Name: t.name, PublicURL: s.TunnelURL(t.id), MaxBody: s.cfg.MaxBody, MaxFrame: s.cfg.MaxFrame, Queued: queued, Version: s.cfg.Version,
		ForwardTimeoutMS: s.cfg.ForwardTimeout.Milliseconds(),
	})})
	go ac.drainLoop()
	err = ac.readLoop()
	ac.close(err)
	ac.failPending()
	t.mu.Lock()
	if t.agent == ac {
		t.agent = nil
	}
	t.mu.Unlock()
	s.metrics.agentsConnected.Add(-1)
	log.Info("agent disconnected", "reason", err)
}

// hijackBatch hands the upgrader a batchConn over the hijacked connection,
// so that sendLoop can batch its writes.
type hijackBatch struct {
	http.ResponseWriter
	bc *batchConn // set by Hijack
}

func (h *hijackBatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("relay: connection cannot be hijacked")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.bc = newBatchConn(conn)
	return h.bc, brw, nil
}

func offers(r *http.Request, proto string) bool {
	for _, p := range websocket.Subprotocols(r) {
		if p == proto {
			return true
		}
	}
	return false
}

// drainWindow bounds queued requests sent but not yet acknowledged.
const drainWindow = 32

// agentConn is the relay's end of one agent's websocket.
type agentConn struct {
	*wsConn
	srv *Server
	t   *tunnel

	nextStream atomic.Uint64

	mu      sync.Mutex
	pending map[uint64]*pending // guarded by mu: live requests by stream
	queued  map[uint64]int64    // guarded by mu: queued requests sent, stream → queue seq
	window  chan struct{}       // semaphore of queued requests awaiting ack
	acked   chan int64          // queue seqs the agent acknowledged, for drainLoop to delete
}

// pending is a live request waiting for its ack and response.
type pending struct {
	acked chan struct{}  // closed on ack
	resp  chan *response // cap 1
}

// response is a decoded response frame and the buffer behind it.
type response struct {
	*Response
	buf *bytes.Buffer
}

func (r *response) release() { putBuf(r.buf) }

// goAway tells the agent why it is being dropped, then closes.
func (ac *agentConn) goAway(g GoAway) {
	done := make(chan struct{})
	err := ac.send(outFrame{head: appendGoAway(nil, g), written: func() { close(done) }}, nil)
	if err == nil {
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
	}
	ac.writeClose(websocket.CloseNormalClosure, g.Message)
	ac.close(fmt.Errorf("goaway: %s", g.Message))
}

// roundTrip sends req and waits for the agent's ack and response. acked
// reports whether the agent said it saved the request.
func (ac *agentConn) roundTrip(ctx context.Context, req *Request, buf *bytes.Buffer) (*response, bool, error) {
	req.Stream = ac.nextStream.Add(1)
	p := &pending{acked: make(chan struct{}), resp: make(chan *response, 1)}
	ac.mu.Lock()
	ac.pending[req.Stream] = p
	ac.mu.Unlock()
	defer func() {
		ac.mu.Lock()
		delete(ac.pending, req.Stream)
		ac.mu.Unlock()
	}()
	written := make(chan struct{})
	err := ac.send(outFrame{head: appendRequestHead(nil, req), body: req.Body, written: func() { close(written) }}, ctx.Done())
	// The body buffer belongs to the frame until sendLoop is done with it.
	defer func() { <-written; putBuf(buf) }()
	if err != nil {
		return nil, false, err
	}
	isAcked := func() bool {
		select {
		case <-p.acked:
			return true
		default:
			return false
		}
	}
	select {
	case r := <-p.resp:
		return r, true, nil
	case <-ctx.Done():
		return nil, isAcked(), ctx.Err()
	case <-ac.done:
		// A response may have landed just before the close.
		select {
		case r := <-p.resp:
			return r, true, nil
		default:
		}
		return nil, isAcked(), errConnClosed
	}
}

// failPending forgets the queued requests in flight: they stay in the
// queue and go again on the next connection. Live waiters need no wake-up:
// they watch ac.done.
func (ac *agentConn) failPending() {
	ac.mu.Lock()
	ac.queued = map[uint64]int64{}
	ac.mu.Unlock()
}

// readLoop is the connection's only reader.
func (ac *agentConn) readLoop() error {
	for {
		buf, err := ac.readFrame()
		if err != nil {
			return err
		}
		b := buf.Bytes()
		switch b[0] {
		case frameAck:
			stream, err := decodeAck(b)
			putBuf(buf)
			if err != nil {
				return err
			}
			ac.handleAck(stream)
		case frameResponse:
			r, err := decodeResponse(b)
			if err != nil {
				putBuf(buf)
				return err
			}
			ac.mu.Lock()
			p := ac.pending[r.Stream]
			ac.mu.Unlock()
			if p == nil {
				putBuf(buf) // the sender gave up, or a response to a queued request
				continue
			}
			select {
			case p.resp <- &response{Response: r, buf: buf}:
			default:
				putBuf(buf)
				return fmt.Errorf("%w: two responses for stream %d", errMalformed, r.Stream)
			}
		default:
			typ := b[0] // b is the buffer's: read it before the buffer goes back
			putBuf(buf)
			return fmt.Errorf("%w: unexpected frame type 0x%02x from agent", errMalformed, typ)
		}
	}
}

func (ac *agentConn) handleAck(stream uint64) {
	ac.mu.Lock()
	p := ac.pending[stream]
	seq, isQueued := ac.queued[stream]
	delete(ac.queued, stream)
	ac.mu.Unlock()
	if p != nil {
		select {
		case <-p.acked:
		default:
			close(p.acked)
		}
		return
	}
	if !isQueued {
		return
	}
	// Ack means the agent saved it: only now may the relay forget it.
	// drainLoop deletes it, with the other acks that came meanwhile.
	ac.acked <- seq // never blocks: at most drainWindow are unacknowledged
}

// dequeueAcked removes the queued requests the agent acknowledged from the
// queue: first and all others acknowledged meanwhile, in one transaction (a
// commit per request capped a drain at ~1,600/s), and only then counts them
// out and opens the window for more. drainLoop calls it whenever it waits.
func (ac *agentConn) dequeueAcked(first int64) {
	seqs := []int64{first}
	for {
		select {
		case seq := <-ac.acked:
			seqs = append(seqs, seq)
			continue
		default:
		}
		break
	}
	ac.dequeue(seqs)
}

// flushAcked removes what was acknowledged before the connection closed.
func (ac *agentConn) flushAcked() {
	select {
	case seq := <-ac.acked:
		ac.dequeueAcked(seq)
	default:
	}
}

func (ac *agentConn) dequeue(seqs []int64) {
	if err := ac.srv.cfg.DB.Dequeue(context.Background(), seqs...); err != nil {
		ac.srv.log.Error("dequeue", "tunnel", ac.t.id, "err", err)
	}
	t := ac.t
	t.mu.Lock()
	t.queued -= len(seqs)
	if t.queued <= 0 {
		t.queued, t.queuedBytes = 0, 0
	}
	left := t.queued
	t.mu.Unlock()
	for range seqs {
		<-ac.window
	}
	if left == 0 {
		ac.trySend(outFrame{head: appendJSON(nil, frameNotice, Notice{Rejected: t.rejected.Load()})})
	}
}

// drainLoop delivers the tunnel's offline queue in arrival order, keeping
// at most drainWindow requests unacknowledged, and removes from the queue
// what the agent acknowledged.
func (ac *agentConn) drainLoop() {
	t := ac.t
	var after int64
	ctx := context.Background()
	for {
		batch, err := ac.srv.cfg.DB.QueuedAfter(ctx, t.id, after, drainWindow)
		if err != nil {
			ac.srv.log.Error("read queue", "tunnel", t.id, "err", err)
			ac.close(err)
			return
		}
		if len(batch) == 0 {
			// An idle tunnel parks here without timers: thousands of them
			// must cost nothing. Only a place reserved by an insert that had
			// not committed when we looked needs a second look soon.
			t.mu.Lock()
			reserved := t.queued > 0
			t.mu.Unlock()
			var retry <-chan time.Time
			if reserved {
				retry = time.After(50 * time.Millisecond)
			}
			select {
			case <-t.kick:
			case <-retry:
			case seq := <-ac.acked:
				ac.dequeueAcked(seq)
			case <-ac.done:
				ac.flushAcked()
				return
			}
			continue
		}
		for _, q := range batch {
		room:
			for {
				select {
				case ac.window <- struct{}{}:
					break room
				case seq := <-ac.acked:
					ac.dequeueAcked(seq)
				case <-ac.done:
					ac.flushAcked()
					return
				}
			}
			hdr, err := decodeHeaderBytes(q.Headers)
			if err != nil {
				ac.srv.log.Error("queued request unreadable; dropping", "tunnel", t.id, "id", q.ID, "err", err)
				ac.srv.cfg.DB.Dequeue(ctx, q.Seq)
				<-ac.window
				continue
			}
			req := &Request{Stream: ac.nextStream.Add(1), Queued: true, ArrivedAt: q.ArrivedAt, ID: q.ID, Method: q.Method, URI: q.URI, Header: hdr}
			ac.mu.Lock()
			ac.queued[req.Stream] = q.Seq
			ac.mu.Unlock()
			if err := ac.send(outFrame{head: appendRequestHead(nil, req), body: q.Body}, nil); errors.Is(err, errFrameTooLarge) {
				// This agent reads smaller frames than the relay took: the
				// request stays queued, for an agent that reads it, rather
				// than stalling every request behind it.
				ac.srv.log.Warn("queued request larger than the agent reads; kept for another agent", "tunnel", t.id, "id", q.ID, "bytes", len(q.Body))
				ac.mu.Lock()
				delete(ac.queued, req.Stream)
				ac.mu.Unlock()
				<-ac.window
			} else if err != nil {
				return
			}
			after = q.Seq
		}
	}
}

func decodeHeaderBytes(b []byte) (Header, error) {
	d := decoder{b: b}
	h := d.header()
	return h, d.err
}

// metrics are the relay's Prometheus counters.
type metrics struct {
	agentsConnected atomic.Int64
	byClass         [6]atomic.Int64 // index status/100; 0 for anything odd
	bytesIn         atomic.Int64
	bytesOut        atomic.Int64
}

func (m *metrics) countStatus(code int) {
	c := code / 100
	if c < 1 || c > 5 {
		c = 0
	}
	m.byClass[c].Add(1)
}

func (s *Server) serveMetrics(w http.ResponseWriter) {
	var depth int
	var bytes int64
	for _, t := range s.snapshotTunnels() {
		t.mu.Lock()
		depth += t.queued
		bytes += t.queuedBytes
		t.mu.Unlock()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP calltap_tunnels_connected Tunnels with an agent connected.\n# TYPE calltap_tunnels_connected gauge\ncalltap_tunnels_connected %d\n", s.metrics.agentsConnected.Load())
	fmt.Fprintf(&b, "# HELP calltap_requests_total Requests answered to senders, by status class.\n# TYPE calltap_requests_total counter\n")
	for c := 1; c <= 5; c++ {
		fmt.Fprintf(&b, "calltap_requests_total{class=\"%dxx\"} %d\n", c, s.metrics.byClass[c].Load())
	}
	fmt.Fprintf(&b, "# HELP calltap_queue_depth Requests held in offline queues.\n# TYPE calltap_queue_depth gauge\ncalltap_queue_depth %d\n", depth)
	fmt.Fprintf(&b, "# HELP calltap_queue_bytes Bytes held in offline queues.\n# TYPE calltap_queue_bytes gauge\ncalltap_queue_bytes %d\n", bytes)
	fmt.Fprintf(&b, "# HELP calltap_bytes_in_total Request body bytes received from senders.\n# TYPE calltap_bytes_in_total counter\ncalltap_bytes_in_total %d\n", s.metrics.bytesIn.Load())
	fmt.Fprintf(&b, "# HELP calltap_bytes_out_total Response body bytes sent to senders.\n# TYPE calltap_bytes_out_total counter\ncalltap_bytes_out_total %d\n", s.metrics.bytesOut.Load())
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write([]byte(b.String()))
}
