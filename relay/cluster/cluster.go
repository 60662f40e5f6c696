// Package cluster keeps a relay's shared state in NATS JetStream, so that
// several `calltap relay --nats` nodes act as one relay:
//
//   - tokens (their hashes only) and settings: key-value bucket calltap_tokens
//   - which node holds each tunnel's agent: key-value bucket calltap_tunnels
//   - the offline queue: stream CALLTAP_QUEUE, subject calltap.queue.<tunnel>
//   - bodies too large for one NATS message: stream CALLTAP_BODIES, in chunks
//   - the ACME certificate cache: key-value bucket calltap_certs
//
// A request that lands on a node other than the one holding its agent is
// handed to that node in one NATS request on calltap.node.<node>.forward
// (relay/protocol.go has the layout), and a node that queued a request
// publishes calltap.kick.<tunnel> so the holder drains it. Every node
// mirrors the two small buckets through watches: looking up a token or a
// holder costs no round trip.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/storage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names in NATS.
const (
	bucketTokens  = "calltap_tokens"
	bucketTunnels = "calltap_tunnels"
	bucketCerts   = "calltap_certs"
	streamQueue   = "CALLTAP_QUEUE"
	subjectQueue  = "calltap.queue." // + tunnel id
	subjectKick   = "calltap.kick."  // + tunnel id
)

func nodeSubject(node string) string { return "calltap.node." + node + ".forward" }

// Message headers.
const (
	hdrTunnel     = "Calltap-Tunnel"
	hdrBodyChunks = "Calltap-Body-Chunks" // the body is in CALLTAP_BODIES, at these sequences
	hdrArrived    = "Calltap-Arrived"
	hdrMethod     = "Calltap-Method"
	hdrURI        = "Calltap-Uri"
)

// Options configure a node's connection to the cluster.
type Options struct {
	URLs     string // comma-separated nats:// URLs of the NATS servers
	Creds    string // NATS credentials file, if the servers require one
	Replicas int    // copies JetStream keeps of each bucket and the queue: 1, 3 or 5

	// Node names this relay among the others; the default is the host
	// name and a random suffix, new on every start.
	Node string

	QueueMaxAge   time.Duration // queued requests older than this go (the stream's max age)
	QueueMaxCount int           // most requests queued per tunnel (the stream's max per subject)

	// Tool is set by commands that are not a relay node (calltap relay
	// token): they use the buckets and streams as the nodes made them,
	// creating only what is missing, so that a token command's defaults
	// never change the nodes' replicas or queue limits.
	Tool bool

	// RequestTimeout bounds one JetStream operation; NATS being away
	// must turn into a 503 the sender retries, not a sender left waiting.
	RequestTimeout time.Duration // 5 s

	Logger *slog.Logger
}

// Cluster is one relay node's view of the shared state. It implements
// relay.Store, relay.Cluster and relay.TokenStore.
type Cluster struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	node string
	log  *slog.Logger
	opts Options

	tokens  jetstream.KeyValue
	tunnels jetstream.KeyValue
	certs   jetstream.KeyValue
	bodies  jetstream.Stream
	queue   jetstream.Stream

	// maxInline is the largest body sent inside a message; larger ones go
	// in chunks of this size through CALLTAP_BODIES. NATS refuses a message over the servers'
	// max_payload (1 MiB unless raised), and the relay takes bodies of up
	// to --max-body (10 MiB).
	maxInline int

	stopWatch context.CancelFunc
	watching  sync.WaitGroup

	mu        sync.Mutex
	byHash    map[string]*storage.Token // guarded by mu; mirror of hash.* in calltap_tokens
	byTunnel  map[string]*storage.Token // guarded by mu; the same tokens by tunnel id
	holders   map[string]holder         // guarded by mu; mirror of calltap_tunnels
	mine      map[string]uint64         // guarded by mu; tunnels held here → revision of the hold
	takenOver func(tunnelID string)     // guarded by mu; set by Serve
	revoked   func(tunnelID string)     // guarded by mu; set by Serve
	bodyKeys  map[int64]string          // guarded by mu; queue seq → its body's chunks, for Dequeue
}

type holder struct {
	relay.Holding
	rev uint64
}

var _ interface {
	relay.Store
	relay.Cluster
	relay.TokenStore
} = (*Cluster)(nil)

// Open connects to NATS, creates the buckets and the stream if they are
// missing, and loads the mirrors. Close releases it.
func Open(ctx context.Context, o Options) (*Cluster, error) {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 5 * time.Second
	}
	if o.QueueMaxAge <= 0 {
		o.QueueMaxAge = relay.DefaultConfig().QueueMaxAge
	}
	if o.QueueMaxCount <= 0 {
		o.QueueMaxCount = relay.DefaultConfig().QueueMaxCount
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Node == "" {
		o.Node = defaultNode()
	}
	if !validNode(o.Node) {
		return nil, fmt.Errorf("node name %q: use letters, digits, '-' and '_'", o.Node)
	}
	c := &Cluster{node: o.Node, log: o.Logger, opts: o,
		byHash: map[string]*storage.Token{}, byTunnel: map[string]*storage.Token{}, holders: map[string]holder{}, mine: map[string]uint64{}, bodyKeys: map[int64]string{}}
	nopts := []nats.Option{
		nats.Name("calltap relay " + o.Node),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// While disconnected, a publish fails at once instead of waiting
		// in a buffer: the relay must not answer 202 for a request it may
		// never store, nor 503 for one stored later behind its back.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			c.log.Warn("NATS disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.log.Info("NATS reconnected", "server", nc.ConnectedUrlRedacted())
		}),
		// Without a handler nats.go prints these to stderr itself.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			c.log.Warn("NATS", "subject", subject, "err", err)
		}),
	}
	if o.Creds != "" {
		nopts = append(nopts, nats.UserCredentials(o.Creds))
	}
	nc, err := nats.Connect(o.URLs, nopts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", o.URLs, err)
	}
	c.nc = nc
	if err := c.setUp(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) setUp(ctx context.Context) error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	c.js = js
	r := c.opts.Replicas
	kv := func(name, desc string) (b jetstream.KeyValue, err error) {
		err = c.retry(ctx, func(ctx context.Context) (err error) {
			if c.opts.Tool {
				if b, err = js.KeyValue(ctx, name); !errors.Is(err, jetstream.ErrBucketNotFound) {
					return err
				}
			}
			b, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, Description: desc, Storage: jetstream.FileStorage, Replicas: r, History: 1})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("key-value bucket %s: %w", name, err)
		}
		return b, nil
	}
	stream := func(cfg jetstream.StreamConfig) (st jetstream.Stream, err error) {
		err = c.retry(ctx, func(ctx context.Context) (err error) {
			if c.opts.Tool {
				if st, err = js.Stream(ctx, cfg.Name); !errors.Is(err, jetstream.ErrStreamNotFound) {
					return err
				}
			}
			st, err = js.CreateOrUpdateStream(ctx, cfg)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", cfg.Name, err)
		}
		return st, nil
	}
	if c.tokens, err = kv(bucketTokens, "calltap relay: token hashes and settings"); err != nil {
		return err
	}
	if c.tunnels, err = kv(bucketTunnels, "calltap relay: which node holds each tunnel's agent"); err != nil {
		return err
	}
	if c.certs, err = kv(bucketCerts, "calltap relay: ACME account and certificates"); err != nil {
		return err
	}
	c.bodies, err = stream(jetstream.StreamConfig{
		Name:        streamBodies,
		Description: "calltap relay: chunks of bodies too large for one message",
		Subjects:    []string{subjectBody + "*"},
		Storage:     jetstream.FileStorage,
		Replicas:    r,
		MaxAge:      c.opts.QueueMaxAge,
	})
	if err != nil {
		return err
	}
	c.queue, err = stream(jetstream.StreamConfig{
		Name:        streamQueue,
		Description: "calltap relay: requests kept for agents that are away, one subject per tunnel",
		Subjects:    []string{subjectQueue + "*"},
		Storage:     jetstream.FileStorage,
		Replicas:    r,
		MaxAge:      c.opts.QueueMaxAge,
		// The per-tunnel count limit is the stream's: exact across nodes.
		MaxMsgsPerSubject:    int64(c.opts.QueueMaxCount),
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		// A publish retried after a lost ack is stored once: the request
		// id is its message id.
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return err
	}
	// A message carries the request head and its headers besides the
	// body; 64 KiB is the relay's largest request head.
	c.maxInline = max(int(c.nc.MaxPayload())-(64<<10)-1024, 0)
	return c.watch(ctx)
}

// setUpTimeout bounds the retries of setUp's steps: nodes starting
// together create the same buckets at once, and a JetStream cluster just
// formed has no leaders for a moment, which both show as timeouts.
const setUpTimeout = time.Minute

// retry runs step again while it times out, for up to setUpTimeout. The
// first try has a second, each next one twice as long up to
// RequestTimeout: a create that lost a race with another node's hangs
// rather than fails (nats-io/nats.go#949), and is best abandoned early.
// Other errors (no JetStream, too few servers for the replicas asked) are
// returned at once.
func (c *Cluster) retry(ctx context.Context, step func(context.Context) error) error {
	deadline := time.Now().Add(setUpTimeout)
	wait, try := 100*time.Millisecond, time.Second
	for {
		tctx, cancel := context.WithTimeout(ctx, min(try, c.opts.RequestTimeout))
		try *= 2
		err := step(tctx)
		cancel()
		transient := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
		if err == nil || !transient || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		c.log.Info("JetStream not ready; trying again", "err", err, "in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// watch starts the mirrors of the tokens and the holders and returns once
// both hold what the buckets held.
func (c *Cluster) watch(ctx context.Context) error {
	wctx, stop := context.WithCancel(context.Background())
	c.stopWatch = stop
	tw, err := c.tokens.Watch(wctx, "hash.>")
	if err != nil {
		stop()
		return err
	}
	hw, err := c.tunnels.WatchAll(wctx)
	if err != nil {
		stop()
		return err
	}
	loaded := make(chan struct{}, 2)
	c.watching.Go(func() { c.follow(tw, loaded, c.applyToken) })
	c.watching.Go(func() { c.follow(hw, loaded, c.applyHolder) })
	for range 2 {
		select {
		case <-loaded:
		case <-ctx.Done():
			stop()
			c.watching.Wait()
			return ctx.Err()
		}
	}
	return nil
}

// follow applies a watcher's entries until it stops. A nil entry marks the
// end of what the bucket held when the watch began.
func (c *Cluster) follow(w jetstream.KeyWatcher, loaded chan<- struct{}, apply func(jetstream.KeyValueEntry)) {
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil {
			loaded <- struct{}{}
			continue
		}
		apply(e)
	}
}

type tokenRecord struct {
	Name      string     `json:"name"`
	TunnelID  string     `json:"tunnel_id"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

func (c *Cluster) applyToken(e jetstream.KeyValueEntry) {
	hash := strings.TrimPrefix(e.Key(), "hash.")
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		if t := c.byHash[hash]; t != nil {
			delete(c.byTunnel, t.TunnelID)
		}
		delete(c.byHash, hash)
		return
	}
	var r tokenRecord
	if json.Unmarshal(e.Value(), &r) != nil {
		c.log.Warn("unreadable token record in NATS", "key", e.Key())
		return
	}
	t := &storage.Token{Name: r.Name, TunnelID: r.TunnelID, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt}
	c.byHash[hash] = t
	c.byTunnel[t.TunnelID] = t
	if t.RevokedAt != nil && c.revoked != nil {
		// At once, not at the relay's next look at RevokedTunnels; in its
		// own goroutine, as it waits for the agent to be told.
		go c.revoked(t.TunnelID)
	}
}

func (c *Cluster) applyHolder(e jetstream.KeyValueEntry) {
	id := e.Key()
	var h relay.Holding
	if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &h) != nil {
		c.log.Warn("unreadable tunnel record in NATS", "key", id)
		return
	}
	c.mu.Lock()
	if cur, ok := c.holders[id]; ok && cur.rev > e.Revision() {
		c.mu.Unlock()
		return // Hold stored a newer one already
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.holders, id)
	} else {
		c.holders[id] = holder{h, e.Revision()}
	}
	rev, held := c.mine[id]
	lost := held && e.Revision() > rev && h.Node != c.node
	if lost {
		delete(c.mine, id)
	}
	takenOver := c.takenOver
	c.mu.Unlock()
	if lost && takenOver != nil {
		takenOver(id)
	}
}

// Self names this node.
func (c *Cluster) Self() string { return c.node }

// Holder says which node holds tunnelID's agent.
func (c *Cluster) Holder(tunnelID string) relay.Holding {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holders[tunnelID].Holding
}

// Hold records that this node holds tunnelID's agent.
func (c *Cluster) Hold(ctx context.Context, tunnelID string, require []relay.HeaderField) (func(), error) {
	h := relay.Holding{Node: c.node, Require: require}
	b, _ := json.Marshal(h)
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	rev, err := c.tunnels.Put(ctx, tunnelID, b)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.mine[tunnelID] = rev
	if c.holders[tunnelID].rev < rev {
		c.holders[tunnelID] = holder{h, rev}
	}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		ours := c.mine[tunnelID] == rev
		if ours {
			delete(c.mine, tunnelID)
		}
		c.mu.Unlock()
		if !ours {
			return
		}
		// Only if nobody took it since: the agent may be on another node
		// already.
		b, _ := json.Marshal(relay.Holding{Require: require})
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.RequestTimeout)
		defer cancel()
		if _, err := c.tunnels.Update(ctx, tunnelID, b, rev); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			c.log.Warn("could not record that the agent left", "tunnel", tunnelID, "err", err)
		}
	}, nil
}

// forgetHolder records that node no longer holds tunnelID, if the mirror
// still says it does: the node is gone.
func (c *Cluster) forgetHolder(tunnelID, node string) {
	c.mu.Lock()
	h := c.holders[tunnelID]
	c.mu.Unlock()
	if h.Node != node {
		return
	}
	b, _ := json.Marshal(relay.Holding{Require: h.Require})
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.RequestTimeout)
	defer cancel()
	c.tunnels.Update(ctx, tunnelID, b, h.rev) // lost to a newer holder: fine
}

// Stats are a node's view of the cluster, for /metrics.
func (c *Cluster) Stats(ctx context.Context) (relay.ClusterStats, error) {
	var s relay.ClusterStats
	rtt, err := c.nc.RTT()
	if err != nil {
		return s, err
	}
	s.RTT = rtt
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	info, err := c.queue.Info(ctx)
	if err != nil {
		return s, err
	}
	s.Queued = info.State.Msgs
	return s, nil
}

// Close stops the mirrors and closes the connection.
func (c *Cluster) Close() error {
	c.stopWatch()
	c.watching.Wait()
	c.nc.Close()
	return nil
}

// failoverGrace is how long a request waits for the client to reach
// another NATS server when its own is gone: a failover of a few hundred
// milliseconds should cost the sender a little time, not a 503.
const failoverGrace = 2 * time.Second

// connected returns once NATS is reachable, or fails after failoverGrace.
func (c *Cluster) connected(ctx context.Context) error {
	if c.nc.IsConnected() {
		return nil
	}
	// Listen first, then look again: a reconnection between the two
	// would otherwise go unseen.
	changed := c.nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer c.nc.RemoveStatusListener(changed)
	t := time.NewTimer(failoverGrace)
	defer t.Stop()
	for !c.nc.IsConnected() {
		select {
		case <-changed:
		case <-t.C:
			return errUnavailable
		case <-ctx.Done():
			return errUnavailable
		}
		if c.nc.IsClosed() {
			return errUnavailable
		}
	}
	return nil
}

var errUnavailable = errors.New("cluster: no NATS server is reachable")

func defaultNode() string {
	h, _ := os.Hostname()
	h = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, h)
	var b [3]byte
	rand.Read(b[:])
	if h == "" {
		return "node-" + hex.EncodeToString(b[:])
	}
	return h + "-" + hex.EncodeToString(b[:])
}

func validNode(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}
