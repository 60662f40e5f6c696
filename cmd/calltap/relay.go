package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/certs"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/relaydb"
)

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
// limits are the stream's, its call memory the calls bucket's max age),
// or as a token command without.
func (f *natsFlags) open(ctx context.Context, rf *relayFlags, log *slog.Logger) (*cluster.Cluster, error) {
	o := cluster.Options{URLs: f.urls, Creds: f.creds, Replicas: f.replicas, Node: f.node, Logger: log, Tool: rf == nil}
	if rf != nil {
		o.QueueMaxAge, o.QueueMaxCount, o.CallMemory = rf.queueMaxAge, rf.queueMaxCount, rf.config(nil, "").CallMemory
	}
	return cluster.Open(ctx, o)
}

// checkRelayFlags checks calltap relay's flags against each other.
func checkRelayFlags(fs *flagSet, rf *relayFlags, tf *tlsFlags, nf *natsFlags, insecure bool) error {
	if len(fs.args) > 0 {
		return usagef("unexpected argument %q", fs.args[0])
	}
	for _, validate := range []func() error{rf.validate, func() error { return tf.validate(insecure) }, nf.validate} {
		if err := validate(); err != nil {
			return usagef("%v", err)
		}
	}
	if nf.urls != "" && flagGiven(fs, "queue-max-bytes") {
		// A stream counts messages per subject, not their bytes: a byte
		// limit per tunnel would be each node's guess, not a limit.
		return usagef("--queue-max-bytes cannot be kept with --nats (the stream counts requests, not bytes, per tunnel); use --queue-max-count")
	}
	return nil
}

// relayStore is where a relay keeps its state: a cluster's NATS, or the
// data directory's SQLite.
type relayStore struct {
	db      relay.Store
	admin   relay.TokenStore
	cluster *cluster.Cluster // nil for one node
	close   func()
}

func openRelayStore(ctx context.Context, nf *natsFlags, rf *relayFlags, tf *tlsFlags, dataDir string, sync syncFlag, log *slog.Logger) (*relayStore, error) {
	if nf.urls != "" {
		c, err := nf.open(ctx, rf, log)
		if err != nil {
			return nil, err
		}
		tf.shared = c.CertCache
		log.Info("relay node of a cluster", "node", c.Self(), "nats", nf.urls, "replicas", nf.replicas)
		return &relayStore{db: c, admin: c, cluster: c, close: func() { c.Close() }}, nil
	}
	sdb, err := relayDB(ctx, dataDir, storage.WithSync(sync.syncMode()))
	if err != nil {
		return nil, err
	}
	return &relayStore{db: sdb, admin: sdb, close: func() { sdb.Close() }}, nil
}

func cmdRelay(ctx context.Context, args []string, stdio Stdio) int {
	if len(args) > 0 && args[0] == "token" {
		return cmdRelayToken(ctx, args[1:], stdio)
	}
	if len(args) > 0 && args[0] == "claims" {
		return cmdRelayClaims(ctx, args[1:], stdio)
	}
	fs := newFlagSet("relay", "calltap relay [flags]  |  calltap relay token create|list|revoke  |  calltap relay claims [release]",
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
	if err := checkRelayFlags(fs, &rf, &tf, &nf, *insecure); err != nil {
		return exitCode(stdio, "relay", err)
	}
	log := newLogger(stdio, *jsonLogs, *logVerbose)
	st, err := openRelayStore(ctx, &nf, &rf, &tf, *dataDir, sync, log)
	if err != nil {
		return fail(stdio, "relay", err)
	}
	defer st.close()
	db, admin, cl := st.db, st.admin, st.cluster
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
		return relayTokenUsage(args, stdio)
	}
	t := tokenCmd{sub: args[0]}
	name := "relay token " + t.sub
	fs := newFlagSet("relay token "+t.sub, "calltap relay token "+t.sub+" [NAME] --data DIR", "Manage developers' tokens in a relay's data directory.")
	fs.StringVar(&t.dataDir, "data", defaultDataDir(), "the relay's data `dir`ectory")
	fs.BoolVar(&t.asJSON, "json", false, "print JSON")
	t.nf.register(fs, false)
	if t.sub == "create" {
		fs.StringVar(&t.publicURL, "public-url", "", "the relay's public `url` (default: the one the relay last ran with)")
	}
	switch t.sub {
	case "create", "list", "revoke":
	default:
		return usageError(stdio, "relay token", "unknown subcommand %q: want create, list or revoke", t.sub)
	}
	if ok, code := parseFlags(fs, args[1:], stdio); !ok {
		return code
	}
	return exitCode(stdio, name, t.run(ctx, fs.args, stdio))
}

// relayTokenUsage answers calltap relay token with no subcommand (exit 2)
// or -h (exit 0).
func relayTokenUsage(args []string, stdio Stdio) int {
	w, code := stdio.Err, 2
	if len(args) > 0 {
		w, code = stdio.Out, 0
	}
	fmt.Fprintln(w, "Usage: calltap relay token create NAME | list | revoke NAME  (--data DIR | --nats URLS) [--json]")
	return code
}

// tokenCmd is calltap relay token's subcommand and flags.
type tokenCmd struct {
	sub, dataDir, publicURL string
	asJSON                  bool
	nf                      natsFlags
}

func (t *tokenCmd) run(ctx context.Context, args []string, stdio Stdio) error {
	want := 1
	if t.sub == "list" {
		want = 0
	}
	switch {
	case len(args) != want && want == 1:
		return usagef("give one token NAME")
	case len(args) != want:
		return usagef("unexpected argument %q", args[0])
	}
	if err := t.nf.validate(); err != nil {
		return usagef("%v", err)
	}
	db, closeDB, err := openRelayAdmin(ctx, &t.nf, t.dataDir)
	if err != nil {
		return err
	}
	defer closeDB()
	switch t.sub {
	case "create":
		return t.create(ctx, db, args[0], stdio)
	case "list":
		return t.list(ctx, db, stdio)
	}
	return t.revoke(ctx, db, args[0], stdio)
}

func (t *tokenCmd) create(ctx context.Context, db relay.TokenStore, name string, stdio Stdio) error {
	pub := t.publicURL
	if pub == "" {
		var err error
		if pub, err = relay.PublicURLOf(ctx, db); err != nil {
			return err
		}
	}
	info, err := relay.CreateToken(ctx, db, name, pub)
	if err != nil {
		return err
	}
	if t.asJSON {
		return json.NewEncoder(stdio.Out).Encode(info)
	}
	fmt.Fprintf(stdio.Out, "Token for %s (shown once; keep it secret):\n  %s\n\nTunnel URL (stable; give it to the voice service as event_webhook_url):\n  %s\n\nOn the laptop:\n  calltap listen --relay %s --token %s --forward-to http://127.0.0.1:3000/webhooks\n",
		info.Name, info.Token, info.URL, orPlaceholder(pub, "<relay-url>"), info.Token)
	return nil
}

// tokenRow is a line of calltap relay token list.
type tokenRow struct {
	Name      string     `json:"name"`
	TunnelID  string     `json:"tunnel_id"`
	URL       string     `json:"url"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

func (t *tokenCmd) list(ctx context.Context, db relay.TokenStore, stdio Stdio) error {
	toks, err := db.Tokens(ctx)
	if err != nil {
		return err
	}
	pub, _ := relay.PublicURLOf(ctx, db)
	rows := []tokenRow{}
	for _, t := range toks {
		rows = append(rows, tokenRow{t.Name, t.TunnelID, strings.TrimRight(pub, "/") + "/t/" + t.TunnelID, t.CreatedAt, t.RevokedAt})
	}
	if t.asJSON {
		return json.NewEncoder(stdio.Out).Encode(rows)
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
	return tw.Flush()
}

func (t *tokenCmd) revoke(ctx context.Context, db relay.TokenStore, name string, stdio Stdio) error {
	if err := db.RevokeToken(ctx, name); errors.Is(err, relaydb.ErrNotFound) {
		return fmt.Errorf("no active token named %q", name)
	} else if err != nil {
		return err
	}
	if t.asJSON {
		return json.NewEncoder(stdio.Out).Encode(map[string]any{"name": name, "revoked": true})
	}
	fmt.Fprintf(stdio.Out, "Revoked %s. A connected agent is dropped within a second, on whichever node it is; its URL answers 404.\n", name)
	return nil
}

// openRelayAdmin opens a relay's state: in NATS with --nats, else in the
// data directory's SQLite.
func openRelayAdmin(ctx context.Context, nf *natsFlags, dataDir string) (relayAdmin, func(), error) {
	if nf.urls != "" {
		c, err := nf.open(ctx, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, nil, err
		}
		return c, func() { c.Close() }, nil
	}
	sdb, err := relayDB(ctx, dataDir)
	if err != nil {
		return nil, nil, err
	}
	return sdb, func() { sdb.Close() }, nil
}

// cmdRelayClaims answers calltap relay claims [--json] and calltap relay
// claims release (claims.go).
func cmdRelayClaims(ctx context.Context, args []string, stdio Stdio) int {
	a := claimsArgs{release: len(args) > 0 && args[0] == "release"}
	name := "relay claims"
	if a.release {
		name, args = name+" release", args[1:]
	}
	var (
		nf natsFlags
		fs = newFlagSet(name, "calltap relay claims [--json]  |  calltap relay claims release SEAT | --token NAME --claim EXPR…  (--data DIR | --nats URLS)", claimsHelp)
	)
	dataDir := fs.String("data", defaultDataDir(), "the relay's data `dir`ectory")
	asJSON := fs.Bool("json", false, "print JSON")
	nf.register(fs, false)
	if a.release {
		fs.StringVar(&a.token, "token", "", "the `name` of the token whose seat to release, with its --claim flags")
		fs.Var(&a.claims, "claim", "a claim of the seat to release, as its agent gave it (`EXPR`; repeatable)")
	}
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	a.args = fs.args
	seat, claims, err := a.check()
	if err == nil {
		err = nf.validate()
	}
	if err != nil {
		return exitCode(stdio, name, usagef("%v", err))
	}
	db, closeDB, err := openRelayAdmin(ctx, &nf, *dataDir)
	if err != nil {
		return fail(stdio, name, err)
	}
	defer closeDB()
	if a.release {
		err = releaseSeat(ctx, db, &a, seat, claims, *asJSON, stdio)
	} else {
		err = listSeats(ctx, db, *asJSON, stdio)
	}
	return exitCode(stdio, name, err)
}
