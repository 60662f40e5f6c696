package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/certs"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/relaydb"
)

// relayFlags are the public server's settings, shared by relay and dev.
type relayFlags struct {
	forwardTimeout time.Duration
	maxBody        int64
	maxHeaderBytes int
	offline        string
	queueMaxCount  int
	queueMaxBytes  int64
	queueMaxAge    time.Duration
	rateLimit      float64
	rateBurst      int
	maxInFlight    int
	authTimeout    time.Duration
	pongWait       time.Duration
	stopGrace      time.Duration
}

// register adds the flags; dev has no rate limit unless asked, since
// everything it serves is on loopback.
func (f *relayFlags) register(fs *flagSet, dev bool) {
	d := relay.DefaultConfig()
	rateLimit := d.RateLimit
	if dev {
		rateLimit = 0
	}
	fs.DurationVar(&f.forwardTimeout, "forward-timeout", d.ForwardTimeout, "how long a sender waits for the local handler before 504")
	fs.Int64Var(&f.maxBody, "max-body", d.MaxBody, "largest body in bytes: a larger request → 413, a larger answer of the local handler → 502")
	fs.IntVar(&f.maxHeaderBytes, "max-header-bytes", d.MaxHeaderBytes, "largest request head in bytes (larger → 431)")
	fs.StringVar(&f.offline, "offline", d.Offline, "`mode` while a tunnel has no agent: queue (store, answer 202) or reject (503 + Retry-After)")
	fs.IntVar(&f.queueMaxCount, "queue-max-count", d.QueueMaxCount, "most requests held per offline tunnel (more → 503)")
	fs.Int64Var(&f.queueMaxBytes, "queue-max-bytes", d.QueueMaxBytes, "most bytes held per offline tunnel (more → 503)")
	fs.DurationVar(&f.queueMaxAge, "queue-max-age", d.QueueMaxAge, "queued requests older than this are dropped")
	fs.Float64Var(&f.rateLimit, "rate-limit", rateLimit, "requests per second per tunnel (more → 429); 0: no limit")
	fs.IntVar(&f.rateBurst, "rate-burst", d.RateBurst, "burst allowed above --rate-limit")
	fs.IntVar(&f.maxInFlight, "max-in-flight", d.MaxInFlight, "concurrent requests per tunnel (more → 503)")
	fs.DurationVar(&f.authTimeout, "auth-timeout", d.AuthTimeout, "time a client has to send its request head (agents: to authenticate)")
	fs.DurationVar(&f.pongWait, "pong-wait", d.Keepalive.PongWait, "an agent silent this long is considered gone")
	fs.DurationVar(&f.stopGrace, "stop-grace", defaultStopGrace, "on SIGTERM, how long requests in flight may take to be answered; those still waiting then get 503 + Retry-After")
}

func (f *relayFlags) config(db relay.Store, publicURL string) relay.Config {
	return relay.Config{
		Store: db, PublicURL: publicURL, Version: version,
		ForwardTimeout: f.forwardTimeout, MaxBody: f.maxBody, MaxHeaderBytes: f.maxHeaderBytes,
		Offline: f.offline, QueueMaxCount: f.queueMaxCount, QueueMaxBytes: f.queueMaxBytes, QueueMaxAge: f.queueMaxAge,
		RateLimit: f.rateLimit, RateBurst: f.rateBurst, NoRateLimit: f.rateLimit == 0, MaxInFlight: f.maxInFlight, AuthTimeout: f.authTimeout,
		Keepalive: frameconn.Keepalive{PongWait: f.pongWait},
	}
}

func (f *relayFlags) validate() error {
	if f.offline != relay.OfflineQueue && f.offline != relay.OfflineReject {
		return fmt.Errorf("--offline must be %q or %q", relay.OfflineQueue, relay.OfflineReject)
	}
	if !(f.rateLimit >= 0) || math.IsInf(f.rateLimit, 0) {
		return fmt.Errorf("--rate-limit must be a number of requests per second, or 0 for no limit; got %v", f.rateLimit)
	}
	if f.rateBurst < 1 {
		return fmt.Errorf("--rate-burst must be 1 or more")
	}
	return nil
}

// flagGiven reports whether name was set on the command line.
func flagGiven(fs *flagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// defaultStopGrace is a relay's --stop-grace: within the 30 s a service
// manager usually waits after SIGTERM before it kills.
const defaultStopGrace = 20 * time.Second

func relayDB(ctx context.Context, dataDir string, opts ...storage.Option) (*relaydb.Store, error) {
	return relaydb.Open(ctx, filepath.Join(dataDir, "relay.db"), opts...)
}

// natsFlags make a relay node of a cluster whose state is in NATS JetStream.
type natsFlags struct {
	urls     string
	creds    string
	replicas int
	node     string
}

func (f *natsFlags) register(fs *flagSet, node bool) {
	fs.StringVar(&f.urls, "nats", "", "NATS server `urls`, comma-separated (nats://a:4222,nats://b:4222): keep tokens, the offline queue and certificates in JetStream, shared by every relay node given the same servers")
	fs.StringVar(&f.creds, "nats-creds", "", "NATS credentials `file` (.creds) for --nats")
	fs.IntVar(&f.replicas, "nats-replicas", cluster.DefaultReplicas, "copies JetStream keeps of the relay's state: 3 needs a cluster of three NATS servers or more; 1 for a single server")
	if node {
		fs.StringVar(&f.node, "node", "", "this node's `name` among the relay nodes (default: host name and a random suffix)")
	}
}

func (f *natsFlags) validate() error {
	if f.urls == "" {
		if f.creds != "" {
			return errors.New("--nats-creds needs --nats")
		}
		return nil
	}
	if f.replicas < 1 || f.replicas > 5 {
		return errors.New("--nats-replicas must be between 1 and 5")
	}
	return nil
}

// open connects to the cluster: as a relay node given rf (its queue
// limits are the stream's), or as a token command without.
func (f *natsFlags) open(ctx context.Context, rf *relayFlags, log *slog.Logger) (*cluster.Cluster, error) {
	o := cluster.Options{URLs: f.urls, Creds: f.creds, Replicas: f.replicas, Node: f.node, Logger: log, Tool: rf == nil}
	if rf != nil {
		o.QueueMaxAge, o.QueueMaxCount = rf.queueMaxAge, rf.queueMaxCount
	}
	return cluster.Open(ctx, o)
}

func cmdRelay(ctx context.Context, args []string, stdio Stdio) int {
	if len(args) > 0 && args[0] == "token" {
		return cmdRelayToken(ctx, args[1:], stdio)
	}
	fs := newFlagSet("relay", "calltap relay [flags]  |  calltap relay token create|list|revoke",
		"Run the public relay: each developer's token gets a stable URL /t/<tunnel-id>/…; requests go over a websocket to\nthat developer's agent, and wait in the relay's queue while the agent is away.")
	var (
		listen     = fs.String("listen", ":443", "`address` of the public listener (HTTPS, or HTTP with --insecure-http)")
		insecure   = fs.Bool("insecure-http", false, "serve plain HTTP on --listen (behind a TLS-terminating proxy, or for local use)")
		publicURL  = fs.String("public-url", "", "`url` senders use to reach this relay (default: derived from --domain, or from --listen)")
		dataDir    = fs.String("data", defaultDataDir(), "data `dir`ectory: tokens, offline queue, certificates")
		tf         tlsFlags
		rf         relayFlags
		jsonLogs   = fs.Bool("log-json", false, "log as JSON")
		logVerbose = fs.Bool("v", false, "log each forwarded request")
		sync       syncFlag
		nf         natsFlags
	)
	sync.register(fs)
	tf.register(fs)
	rf.register(fs, false)
	nf.register(fs, true)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) > 0 {
		return usageError(stdio, "relay", "unexpected argument %q", fs.args[0])
	}
	if err := rf.validate(); err != nil {
		return usageError(stdio, "relay", "%v", err)
	}
	if err := tf.validate(*insecure); err != nil {
		return usageError(stdio, "relay", "%v", err)
	}
	if err := nf.validate(); err != nil {
		return usageError(stdio, "relay", "%v", err)
	}
	if nf.urls != "" && flagGiven(fs, "queue-max-bytes") {
		// A stream counts messages per subject, not their bytes: a byte
		// limit per tunnel would be each node's guess, not a limit.
		return usageError(stdio, "relay", "--queue-max-bytes cannot be kept with --nats (the stream counts requests, not bytes, per tunnel); use --queue-max-count")
	}
	log := newLogger(stdio, *jsonLogs, *logVerbose)
	var (
		db    relay.Store
		admin relay.TokenStore
		cl    *cluster.Cluster
	)
	if nf.urls != "" {
		c, err := nf.open(ctx, &rf, log)
		if err != nil {
			return fail(stdio, "relay", err)
		}
		defer c.Close()
		db, admin, cl = c, c, c
		tf.shared = c.CertCache
		log.Info("relay node of a cluster", "node", c.Self(), "nats", nf.urls, "replicas", nf.replicas)
	} else {
		sdb, err := relayDB(ctx, *dataDir, storage.WithSync(sync.syncMode()))
		if err != nil {
			return fail(stdio, "relay", err)
		}
		defer sdb.Close()
		db, admin = sdb, sdb
	}
	pub := *publicURL
	if pub == "" {
		pub = tf.publicURL(*listen, *insecure)
	}
	if err := relay.SetPublicURL(ctx, admin, pub); err != nil {
		return fail(stdio, "relay", err)
	}
	cfg := rf.config(db, pub)
	cfg.Logger = log
	if cl != nil {
		cfg.Cluster = cl
		// The stream keeps the count limit; bytes it does not count.
		cfg.QueueMaxBytes = math.MaxInt64
	}
	srv, err := relay.NewServer(ctx, cfg)
	if err != nil {
		return fail(stdio, "relay", err)
	}
	if err := serveRelay(ctx, srv, *listen, *insecure, &tf, *dataDir, rf.stopGrace, log); err != nil {
		return fail(stdio, "relay", err)
	}
	return 0
}

// serveRelay runs the relay and its listeners until ctx ends or one of
// them fails.
func serveRelay(ctx context.Context, srv *relay.Server, listen string, insecure bool, tf *tlsFlags, dataDir string, grace time.Duration, log *slog.Logger) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	var public net.Listener = ln
	var parts []func(context.Context) error
	if !insecure {
		certs, err := tf.build(dataDir, listen, log)
		if err != nil {
			ln.Close()
			return err
		}
		// HTTP/1.1 only: agents' websockets need it, and senders are
		// webhooks, one request per connection or a few.
		public = tls.NewListener(ln, certs.Config())
		if tf.httpListen != "" {
			hln, err := net.Listen("tcp", tf.httpListen)
			if err != nil {
				ln.Close()
				return err
			}
			hl := &http.Server{Handler: certs.HTTPHandler(nil), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
			parts = append(parts, serveHTTP(hl, hln, httpGrace))
		}
		parts = append(parts, func(ctx context.Context) error { return keepCertificates(ctx, certs, log) })
	}
	// The relay stops in stages of its own (Server.Serve); the other parts
	// stop with it.
	parts = append(parts, func(ctx context.Context) error { return srv.Serve(ctx, srv.HTTPServer(listen), public, grace) })
	log.Info("relay listening", "addr", ln.Addr().String(), "tls", !insecure, "public_url", srv.TunnelURL("<tunnel-id>"))
	return runParts(ctx, parts...)
}

// keepCertificates gets the certificates now rather than on the first
// sender's handshake, then re-reads --tls-cert/--tls-key on SIGHUP until
// ctx ends.
func keepCertificates(ctx context.Context, certs *certs.TLS, log *slog.Logger) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for _, d := range certs.Domains() {
		if _, err := certs.Obtain(ctx, d); err != nil {
			log.Warn("no certificate yet", "domain", d, "err", err)
		} else {
			log.Info("certificate ready", "domain", d)
		}
	}
	for {
		select {
		case <-hup:
			if err := certs.Reload(); err != nil {
				log.Error("reload certificate", "err", err)
			} else {
				log.Info("certificate reloaded")
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func cmdRelayToken(ctx context.Context, args []string, stdio Stdio) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		w := stdio.Err
		if len(args) > 0 {
			w = stdio.Out
		}
		fmt.Fprintln(w, "Usage: calltap relay token create NAME | list | revoke NAME  (--data DIR | --nats URLS) [--json]")
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub := args[0]
	name := "relay token " + sub
	fs := newFlagSet("relay token "+sub, "calltap relay token "+sub+" [NAME] --data DIR", "Manage developers' tokens in a relay's data directory.")
	dataDir := fs.String("data", defaultDataDir(), "the relay's data `dir`ectory")
	asJSON := fs.Bool("json", false, "print JSON")
	var nf natsFlags
	nf.register(fs, false)
	var publicURL *string
	if sub == "create" {
		publicURL = fs.String("public-url", "", "the relay's public `url` (default: the one the relay last ran with)")
	}
	switch sub {
	case "create", "list", "revoke":
	default:
		return usageError(stdio, "relay token", "unknown subcommand %q: want create, list or revoke", sub)
	}
	if ok, code := parseFlags(fs, args[1:], stdio); !ok {
		return code
	}
	want := 1
	if sub == "list" {
		want = 0
	}
	if len(fs.args) != want {
		if want == 1 {
			return usageError(stdio, name, "give one token NAME")
		}
		return usageError(stdio, name, "unexpected argument %q", fs.args[0])
	}
	if err := nf.validate(); err != nil {
		return usageError(stdio, name, "%v", err)
	}
	var db relay.TokenStore
	if nf.urls != "" {
		c, err := nf.open(ctx, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			return fail(stdio, name, err)
		}
		defer c.Close()
		db = c
	} else {
		sdb, err := relayDB(ctx, *dataDir)
		if err != nil {
			return fail(stdio, name, err)
		}
		defer sdb.Close()
		db = sdb
	}
	switch sub {
	case "create":
		pub := *publicURL
		if pub == "" {
			var err error
			if pub, err = relay.PublicURLOf(ctx, db); err != nil {
				return fail(stdio, name, err)
			}
		}
		info, err := relay.CreateToken(ctx, db, fs.args[0], pub)
		if err != nil {
			return fail(stdio, name, err)
		}
		if *asJSON {
			json.NewEncoder(stdio.Out).Encode(info)
			return 0
		}
		fmt.Fprintf(stdio.Out, "Token for %s (shown once; keep it secret):\n  %s\n\nTunnel URL (stable; give it to the voice service as event_webhook_url):\n  %s\n\nOn the laptop:\n  calltap listen --relay %s --token %s --forward-to http://127.0.0.1:3000/webhooks\n",
			info.Name, info.Token, info.URL, orPlaceholder(pub, "<relay-url>"), info.Token)
	case "list":
		toks, err := db.Tokens(ctx)
		if err != nil {
			return fail(stdio, name, err)
		}
		pub, _ := relay.PublicURLOf(ctx, db)
		type row struct {
			Name      string     `json:"name"`
			TunnelID  string     `json:"tunnel_id"`
			URL       string     `json:"url"`
			CreatedAt time.Time  `json:"created_at"`
			RevokedAt *time.Time `json:"revoked_at"`
		}
		rows := []row{}
		for _, t := range toks {
			rows = append(rows, row{t.Name, t.TunnelID, strings.TrimRight(pub, "/") + "/t/" + t.TunnelID, t.CreatedAt, t.RevokedAt})
		}
		if *asJSON {
			json.NewEncoder(stdio.Out).Encode(rows)
			return 0
		}
		tw := tabwriter.NewWriter(stdio.Out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSTATE\tCREATED\tURL")
		for _, r := range rows {
			state := "active"
			if r.RevokedAt != nil {
				state = "revoked"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, state, r.CreatedAt.Format(time.DateTime), r.URL)
		}
		tw.Flush()
	case "revoke":
		if err := db.RevokeToken(ctx, fs.args[0]); errors.Is(err, relaydb.ErrNotFound) {
			return fail(stdio, name, fmt.Errorf("no active token named %q", fs.args[0]))
		} else if err != nil {
			return fail(stdio, name, err)
		}
		if *asJSON {
			json.NewEncoder(stdio.Out).Encode(map[string]any{"name": fs.args[0], "revoked": true})
			return 0
		}
		fmt.Fprintf(stdio.Out, "Revoked %s. A connected agent is dropped within a second, on whichever node it is; its URL answers 404.\n", fs.args[0])
	}
	return 0
}

func orPlaceholder(s, p string) string {
	if s == "" {
		return p
	}
	return s
}

func newLogger(stdio Stdio, asJSON, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	if asJSON {
		return slog.New(slog.NewJSONHandler(stdio.Err, opts))
	}
	return slog.New(slog.NewTextHandler(stdio.Err, opts))
}
