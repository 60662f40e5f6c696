// Package cluster keeps a relay's shared state in NATS JetStream, so that
// several `calltap relay --nats` nodes act as one relay:
//
//   - tokens (their hashes only) and settings: key-value bucket calltap_tokens
//   - which node holds each tunnel's agent: key-value bucket calltap_tunnels
//   - the offline queue: stream CALLTAP_QUEUE, subject calltap.queue.<tunnel>
//   - queued bodies too large for one NATS message: stream CALLTAP_BODIES, in chunks
//     (a live one goes straight between the two nodes, parts.go)
//   - the ACME certificate cache: key-value bucket calltap_certs
//   - the claimant seats of tokens several agents share: key-value bucket
//     calltap_claims, mirrored on every node (claimants.go)
//   - which seat each call belongs to: key-value bucket calltap_calls,
//     whose entries expire CallMemory after a call's last event (calls.go)
//
// A request that lands on a node other than the one holding its agent is
// handed to that node over NATS on calltap.node.<node>.forward (forward.go
// has the exchange, relay/protocol.go the layout), and a node that queued a
// request asks the holder, on calltap.node.<node>.kick, to count its queue
// again and drain it, and waits for its word (calltap.kick.<tunnel>, to
// every node, when the holder does not answer). Every
// node mirrors the two small buckets through watches: looking up a token or
// a holder costs no round trip.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultReplicas is how many copies JetStream keeps of the relay's state
// unless told otherwise: a team relay runs on a NATS cluster of three, and
// a single copy would be lost with its server.
const DefaultReplicas = 3

// Options configure a node's connection to the cluster.
type Options struct {
	URLs     string // comma-separated nats:// URLs of the NATS servers
	Creds    string // NATS credentials file, if the servers require one
	Replicas int    // copies JetStream keeps of each bucket and the queue: 1, 3 or 5 (DefaultReplicas)

	// Node names this relay among the others; the default is the host
	// name and a random suffix, new on every start.
	Node string

	QueueMaxAge   time.Duration // queued requests older than this go (the stream's max age)
	QueueMaxCount int           // most requests queued per tunnel (the stream's max per subject)

	// CallMemory is how long a call's seat is kept after its last event:
	// the max age of calltap_calls (relay.Config.CallMemory).
	CallMemory time.Duration

	// Tool is set by commands that are not a relay node (calltap relay
	// token): they use the buckets and streams as the nodes made them,
	// creating only what is missing, so that a token command's defaults
	// never change the nodes' replicas or queue limits.
	Tool bool

	// RequestTimeout bounds one JetStream operation; NATS being away
	// must turn into a 503 the sender retries, not a sender left waiting.
	RequestTimeout time.Duration // 2 s

	// PingInterval is how often the client asks its NATS server for a
	// sign of life; after MaxPingsOut unanswered it takes the server for
	// frozen and moves to another. nats.go's default (2 min × 2) would keep
	// a node on a stopped server for minutes.
	PingInterval time.Duration // 1 s
	MaxPingsOut  int           // 3

	Logger *slog.Logger
}

// Cluster is one relay node's view of the shared state. It implements
// relay.Store, relay.Cluster and relay.TokenStore, each job in a part of
// its own: the token mirror (tokens.go), the holder mirror (holders.go),
// the queue (queue.go) with the large bodies (bodies.go), the claimant
// mirror (claimants.go), the call memory (calls.go), and the stats
// (stats.go), over the connection and the names they share (link.go);
// forwards between nodes (forward.go) use them all.
type Cluster struct {
	*link
	node string
	opts Options

	*tokenStore
	*holders
	*queue
	*claimants
	*calls
	bodies *bodyStore
	certs  jetstream.KeyValue
	stats  *statsCache

	stopWatch context.CancelFunc
	watching  sync.WaitGroup
	serving   serving

	lease     *lease             // set by setUp
	stopLease context.CancelFunc // set by Serve; guarded by leaseMu
	leasing   sync.WaitGroup     // the lease's beat, started by Serve
	leaseMu   sync.Mutex
}

var _ interface {
	relay.Store
	relay.Cluster
	relay.TokenStore
} = (*Cluster)(nil)

// withDefaults gives every field not set its default.
func (o Options) withDefaults() Options {
	if o.Replicas <= 0 {
		o.Replicas = DefaultReplicas
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 2 * time.Second
	}
	if o.PingInterval <= 0 {
		o.PingInterval = time.Second
	}
	if o.MaxPingsOut <= 0 {
		o.MaxPingsOut = 3
	}
	if o.QueueMaxAge <= 0 {
		o.QueueMaxAge = relay.DefaultConfig().QueueMaxAge
	}
	if o.QueueMaxCount <= 0 {
		o.QueueMaxCount = relay.DefaultConfig().QueueMaxCount
	}
	if o.CallMemory <= 0 {
		o.CallMemory = relay.DefaultConfig().CallMemory
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Node == "" {
		o.Node = defaultNode()
	}
	return o
}

// Open connects to NATS, creates the buckets and the stream if they are
// missing, and loads the mirrors. Close releases it.
func Open(ctx context.Context, o Options) (*Cluster, error) {
	o = o.withDefaults()
	if !validNode(o.Node) {
		return nil, fmt.Errorf("node name %q: use letters, digits, '-' and '_'", o.Node)
	}
	l := &link{log: o.Logger, timeout: o.RequestTimeout}
	c := &Cluster{link: l, node: o.Node, opts: o}
	nopts := []nats.Option{
		nats.Name("calltap relay " + o.Node),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.PingInterval(o.PingInterval),
		nats.MaxPingsOutstanding(o.MaxPingsOut),
		nats.Timeout(o.RequestTimeout), // connecting to one server
		// While disconnected, a publish fails at once instead of waiting
		// in a buffer: the relay must not answer 202 for a request it may
		// never store, nor 503 for one stored later behind its back.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err == nil && nc.IsClosed() {
				return // our own Close: an orderly stop, nothing to warn of
			}
			l.log.Warn("NATS disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			l.log.Info("NATS reconnected", "server", nc.ConnectedUrlRedacted())
		}),
		// Without a handler nats.go prints these to stderr itself.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			l.log.Warn("NATS", "subject", subject, "err", err)
		}),
	}
	if o.Creds != "" {
		nopts = append(nopts, nats.UserCredentials(o.Creds))
	}
	nc, err := nats.Connect(o.URLs, nopts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", o.URLs, err)
	}
	l.nc = nc
	if err := c.setUp(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	c.stats = startStats(l, c.queue.stream, c.findQueued)
	return c, nil
}

func (c *Cluster) setUp(ctx context.Context) error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	c.js = js
	var ready readiness
	b, err := c.openBuckets(ctx, &ready)
	if err != nil {
		return err
	}
	s, err := c.openStreams(ctx, &ready)
	if err != nil {
		return err
	}
	ready.done(c.log)
	c.certs = b.certs
	c.lease = newLease(c.link, s.nodes, c.node)
	// A message carries the request head and its headers besides the
	// body; 64 KiB is the relay's largest request head.
	c.bodies = &bodyStore{link: c.link, stream: s.bodies, maxInline: max(int(c.nc.MaxPayload())-(64<<10)-1024, 0)}
	c.queue = newQueue(c.link, s.queue, c.bodies)
	c.tokenStore = newTokenStore(c.link, b.tokens)
	c.holders = newHolders(c.link, b.tunnels, c.node)
	c.claimants = newClaimants(c.link, b.claims, c.queue)
	c.calls = &calls{link: c.link, kv: b.calls}
	return c.watch(ctx)
}

// buckets are the key-value buckets of the shared state.
type buckets struct {
	tokens, tunnels, certs, claims, calls jetstream.KeyValue
}

func (c *Cluster) openBuckets(ctx context.Context, ready *readiness) (b buckets, err error) {
	for _, want := range []struct {
		kv  *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&b.tokens, jetstream.KeyValueConfig{Bucket: bucketTokens, Description: "calltap relay: token hashes and settings"}},
		{&b.tunnels, jetstream.KeyValueConfig{Bucket: bucketTunnels, Description: "calltap relay: which node holds each tunnel's agent"}},
		{&b.certs, jetstream.KeyValueConfig{Bucket: bucketCerts, Description: "calltap relay: ACME account and certificates"}},
		{&b.claims, jetstream.KeyValueConfig{Bucket: bucketClaims, Description: "calltap relay: the seats of agents sharing a token, by their claims"}},
		// Each write of a call's record restarts its age: the record
		// goes CallMemory after the call's last event.
		{&b.calls, jetstream.KeyValueConfig{Bucket: bucketCalls, Description: "calltap relay: which seat each call belongs to", TTL: c.opts.CallMemory}},
	} {
		if *want.kv, err = c.bucket(ctx, ready, want.cfg); err != nil {
			return b, err
		}
	}
	return b, nil
}

// bucket opens the bucket cfg names, made or brought to cfg unless this
// is a Tool (then made only if missing).
func (c *Cluster) bucket(ctx context.Context, ready *readiness, cfg jetstream.KeyValueConfig) (b jetstream.KeyValue, err error) {
	cfg.Storage, cfg.Replicas, cfg.History = jetstream.FileStorage, c.opts.Replicas, 1
	err = c.retry(ctx, ready, func(ctx context.Context) (err error) {
		if c.opts.Tool {
			if b, err = c.js.KeyValue(ctx, cfg.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
				return err
			}
		}
		b, err = c.js.CreateOrUpdateKeyValue(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("key-value bucket %s: %w", cfg.Bucket, c.explainReplicas(err))
	}
	return b, nil
}

// streams are the streams of the shared state.
type streams struct {
	bodies, queue, nodes jetstream.Stream
}

func (c *Cluster) openStreams(ctx context.Context, ready *readiness) (s streams, err error) {
	r := c.opts.Replicas
	s.bodies, err = c.stream(ctx, ready, jetstream.StreamConfig{
		Name:        streamBodies,
		Description: "calltap relay: chunks of bodies too large for one message",
		Subjects:    []string{subjectBody + "*"},
		Storage:     jetstream.FileStorage,
		Replicas:    r,
		MaxAge:      c.opts.QueueMaxAge,
	})
	if err != nil {
		return s, err
	}
	s.queue, err = c.stream(ctx, ready, jetstream.StreamConfig{
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
		return s, err
	}
	// The beats of the nodes' leases (lease.go): memory is enough, a beat
	// lost with every server only makes its node beat again; direct gets
	// are off, so that every read is the leader's.
	s.nodes, err = c.stream(ctx, ready, jetstream.StreamConfig{
		Name:              streamNodes,
		Description:       "calltap relay: each node's newest heartbeat, its lease to deliver live",
		Subjects:          []string{subjectAlive + "*"},
		Storage:           jetstream.MemoryStorage,
		Replicas:          r,
		MaxMsgsPerSubject: 1,
		MaxAge:            time.Minute,
		AllowDirect:       false,
	})
	return s, err
}

// stream opens the stream cfg names, made or brought to cfg unless this
// is a Tool (then made only if missing).
func (c *Cluster) stream(ctx context.Context, ready *readiness, cfg jetstream.StreamConfig) (st jetstream.Stream, err error) {
	err = c.retry(ctx, ready, func(ctx context.Context) (err error) {
		if c.opts.Tool {
			if st, err = c.js.Stream(ctx, cfg.Name); !errors.Is(err, jetstream.ErrStreamNotFound) {
				return err
			}
		}
		st, err = c.js.CreateOrUpdateStream(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, c.explainReplicas(err))
	}
	return st, nil
}

// peersJoining reports whether err refuses the replicas asked for while
// as many servers as they need are known: a cluster just started, whose
// servers have not all joined JetStream's meta group yet, or one electing
// its meta leader (a node started beside a stalled server failed its start
// with "temporarily unavailable"). With fewer servers known the refusal
// stands at once (explainReplicas).
func (c *Cluster) peersJoining(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case errCodeInsufficientResources, errCodeNoPeers:
		return len(c.nc.Servers()) >= c.opts.Replicas
	case errCodeClusterNotAvailable:
		return true // a meta leader is being elected: the servers are there
	}
	return false
}

// explainReplicas turns JetStream's refusal of the replicas asked for into
// what to do about it.
func (c *Cluster) explainReplicas(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode {
	case errCodeReplicasNotSupported, errCodeInsufficientResources, errCodeNoPeers:
		return fmt.Errorf("%d replicas asked for (--nats-replicas), and the NATS servers cannot keep that many (%d known: %s); run a cluster of %d or more NATS servers with JetStream, or pass --nats-replicas 1: %w",
			c.opts.Replicas, len(c.nc.Servers()), strings.Join(c.nc.Servers(), ", "), c.opts.Replicas, err)
	}
	return err
}

// JetStream's error codes for a stream or bucket asked for more replicas
// than the servers can place, or while it cannot place any
// (nats-server's jetstream_errors_generated.go).
const (
	errCodeNoPeers               jetstream.ErrorCode = 10005 // a cluster with too few servers
	errCodeInsufficientResources jetstream.ErrorCode = 10023
	errCodeReplicasNotSupported  jetstream.ErrorCode = 10074 // a single server
	// "JetStream system temporarily unavailable": the cluster has no meta
	// leader yet, or is electing one after a server stalled.
	errCodeClusterNotAvailable jetstream.ErrorCode = 10008
)

// setUpTimeout bounds the retries of setUp's steps: nodes starting
// together create the same buckets at once, and a JetStream cluster just
// formed has no leaders for a moment, which both show as timeouts.
const setUpTimeout = time.Minute

// readiness says once that JetStream is not ready, and once that it is.
type readiness struct{ waited bool }

func (r *readiness) notReady(log *slog.Logger, err error) {
	if !r.waited {
		r.waited = true
		log.Info("JetStream not ready; waiting for it", "err", err)
	}
}

func (r *readiness) done(log *slog.Logger) {
	if r.waited {
		log.Info("JetStream ready")
	}
}

// retry runs step again while it times out, for up to setUpTimeout. The
// first try has a second, each next one twice as long up to
// RequestTimeout: a create that lost a race with another node's hangs
// rather than fails (nats-io/nats.go#949), and is best abandoned early.
// Other errors (no JetStream, too few servers for the replicas asked) are
// returned at once.
func (c *Cluster) retry(ctx context.Context, ready *readiness, step func(context.Context) error) error {
	deadline := time.Now().Add(setUpTimeout)
	wait, try := 100*time.Millisecond, time.Second
	for {
		tctx, cancel := context.WithTimeout(ctx, max(min(try, c.timeout), time.Second))
		try *= 2
		err := step(tctx)
		cancel()
		transient := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
			errors.Is(err, jetstream.ErrJetStreamNotEnabled) || c.peersJoining(err)
		if err == nil || !transient || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		ready.notReady(c.log, err)
		c.log.Debug("JetStream not ready; trying again", "err", err, "in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// watch starts the mirrors of the tokens, the holders and the claimants,
// and returns once each holds what its bucket held.
func (c *Cluster) watch(ctx context.Context) error {
	wctx, stop := context.WithCancel(context.Background())
	c.stopWatch = stop
	tw, err := c.tokenStore.kv.Watch(wctx, "hash.>")
	if err != nil {
		stop()
		return err
	}
	hw, err := c.holders.kv.WatchAll(wctx)
	if err != nil {
		stop()
		return err
	}
	cw, err := c.claimants.kv.WatchAll(wctx)
	if err != nil {
		stop()
		return err
	}
	loaded := make(chan struct{}, 3)
	c.watching.Go(func() { follow(tw, loaded, c.tokenStore.apply) })
	c.watching.Go(func() { follow(hw, loaded, c.holders.apply) })
	c.watching.Go(func() { follow(cw, loaded, c.claimants.apply) })
	for range 3 {
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
func follow(w jetstream.KeyWatcher, loaded chan<- struct{}, apply func(jetstream.KeyValueEntry)) {
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil {
			loaded <- struct{}{}
			continue
		}
		apply(e)
	}
}

// Self names this node.
func (c *Cluster) Self() string { return c.node }

// Close is the last step of a node's stop, once its agents are gone and
// their tunnels released: it stops the mirrors and drains the connection,
// so that what this node published (a release, a last answer) reaches
// NATS before the connection closes.
func (c *Cluster) Close() error {
	c.leaseMu.Lock()
	if c.stopLease != nil {
		c.stopLease()
	}
	c.leaseMu.Unlock()
	c.leasing.Wait()
	c.stopWatch()
	c.watching.Wait()
	c.stats.stop()
	if c.queue != nil {
		c.queue.close()
	}
	drained := c.nc.StatusChanged(nats.CLOSED)
	if err := c.nc.Drain(); err != nil {
		c.nc.Close()
		return nil
	}
	select {
	case <-drained:
	case <-time.After(drainTimeout + time.Second):
		c.nc.Close()
	}
	return nil
}

// drainTimeout is nats.go's default bound of Drain.
const drainTimeout = 30 * time.Second

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
