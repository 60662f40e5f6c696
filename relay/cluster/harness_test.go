package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/storage/agentdb"
)

// testLogger returns a logger for one part of a test (a node, an agent):
// what it logs is printed, under name, only if the test fails.
func testLogger(t *testing.T, name string) *slog.Logger {
	l, _ := captureLog(t, name)
	return l
}

// capturedLog is what a test logger wrote, for a test that reads it.
type capturedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// captureLog is testLogger with the lines kept for the test to read.
func captureLog(t *testing.T, name string) (*slog.Logger, *capturedLog) {
	l := &capturedLog{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, l.String())
		}
	})
	return slog.New(slog.NewTextHandler(lockedWriter{&l.mu, &l.buf}, &slog.HandlerOptions{Level: slog.LevelDebug})), l
}

func (l *capturedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// node is one relay node of the cluster, in this process.
type node struct {
	name string
	c    *cluster.Cluster
	srv  *relay.Server
	URL  string
	stop func()
}

// startNode runs a relay node over the NATS cluster on 127.0.0.1:0.
func startNode(t *testing.T, nats *natstest.Cluster, name string, tune func(*relay.Config)) *node {
	t.Helper()
	return startNodeAt(t, nats, name, "127.0.0.1:0", tune)
}

// startNodeAt runs a relay node listening on addr.
func startNodeAt(t *testing.T, nats *natstest.Cluster, name, addr string, tune func(*relay.Config)) *node {
	t.Helper()
	ctx := context.Background()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{name: name, URL: "http://" + ln.Addr().String()}
	log := testLogger(t, "node "+name)
	cfg := relay.Config{PublicURL: n.URL, Logger: log, Version: "test", ForwardTimeout: 5 * time.Second}
	if tune != nil {
		tune(&cfg)
	}
	// As calltap relay does: the queue's limits are the stream's too.
	c, err := cluster.Open(ctx, cluster.Options{URLs: nats.URLs(), Replicas: 3, Node: name, Logger: log, RequestTimeout: 2 * time.Second,
		QueueMaxCount: cfg.QueueMaxCount, QueueMaxAge: cfg.QueueMaxAge})
	if err != nil {
		t.Fatal(err)
	}
	n.c, cfg.Store, cfg.Cluster = c, c, c
	srv, err := relay.NewServer(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.srv = srv
	rctx, cancel := context.WithCancel(ctx)
	hs := srv.HTTPServer(ln.Addr().String())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(rctx) })
	wg.Go(func() { hs.Serve(ln) })
	var once sync.Once
	n.stop = func() {
		once.Do(func() {
			cancel()
			hs.Close()
			wg.Wait()
			c.Close()
		})
	}
	t.Cleanup(n.stop)
	return n
}

// startNodes runs n relay nodes named n0, n1, ….
func startNodes(t *testing.T, nats *natstest.Cluster, n int, tune func(*relay.Config)) []*node {
	var out []*node
	for i := range n {
		out = append(out, startNode(t, nats, fmt.Sprintf("n%d", i), tune))
	}
	return out
}

// runningAgent is a real agent with its SQLite store, connected through
// tunnel.Client to the given nodes.
type runningAgent struct {
	a         *agent.Agent
	db        *agentdb.AgentStore
	clientErr chan error
	stop      func()
}

func startAgent(t *testing.T, dir, token, forwardTo string, nodes ...*node) *runningAgent {
	t.Helper()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.URL)
	}
	return startAgentAt(t, dir, token, forwardTo, strings.Join(urls, ","), nil)
}

// startAgentAt runs an agent connecting to relayURL, resolving names with
// resolver (nil: the system's).
func startAgentAt(t *testing.T, dir, token, forwardTo, relayURL string, resolver *net.Resolver) *runningAgent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	db, err := agentdb.OpenAgent(ctx, filepath.Join(dir, "agent.db"), agentdb.WithIntake())
	if err != nil {
		t.Fatal(err)
	}
	log := testLogger(t, "agent "+dir)
	// The relay's forward timeout is the one tests exercise; the agent's
	// own only bounds a handler's work on a loaded machine (3 MiB bodies).
	a, err := agent.New(agent.Config{Store: db, ForwardTo: forwardTo, Logger: log, ForwardTimeout: 90 * time.Second, ResumeQueued: true})
	if err != nil {
		t.Fatal(err)
	}
	ra := &runningAgent{a: a, db: db, clientErr: make(chan error, 1)}
	c, err := tunnel.NewClient(tunnel.Config{RelayURL: relayURL, Resolver: resolver, Token: token, Handler: a, Logger: log,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, OnState: a.SetConnState})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx) })
	wg.Go(func() { ra.clientErr <- c.Run(ctx) })
	var once sync.Once
	ra.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			db.Close()
		})
	}
	t.Cleanup(ra.stop)
	polltest.Until(t, 10*time.Second, func() bool { return a.TunnelState().State == tunnel.StateConnected }, "the agent did not connect")
	return ra
}

// waitHeld waits until every one of nodes knows which node holds the
// tunnel's agent: until then a node that has not heard queues (202)
// what it would forward.
func waitHeld(t *testing.T, info *relay.TokenInfo, nodes ...*node) {
	t.Helper()
	polltest.Until(t, 10*time.Second, func() bool {
		first := nodes[0].c.Holder(info.TunnelID).Node
		for _, n := range nodes[1:] {
			if n.c.Holder(info.TunnelID).Node != first {
				return false
			}
		}
		return first != ""
	}, "the nodes do not agree which one holds the agent")
}

// captures returns what the agent saved, oldest first.
func (ra *runningAgent) captures(t *testing.T) []*agentdb.Capture {
	t.Helper()
	cs, err := ra.db.CapturesAfter(context.Background(), agentdb.CaptureFilter{}, 0, 100000)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// token mints a token through one node's cluster view.
func token(t *testing.T, n *node, name string) *relay.TokenInfo {
	t.Helper()
	info, err := relay.CreateToken(context.Background(), n.c, name, n.URL)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// tunnelURL is the tunnel's URL on node n.
func tunnelURL(n *node, info *relay.TokenInfo) string { return n.URL + "/t/" + info.TunnelID }

// handler records what reached the developer's local handler.
type handler struct {
	mu     sync.Mutex
	bodies []string
	fn     func(w http.ResponseWriter, r *http.Request, body []byte)
}

func startHandler(t *testing.T, fn func(w http.ResponseWriter, r *http.Request, body []byte)) (*handler, *httptest.Server) {
	h := &handler{fn: fn}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return h, ts
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.bodies = append(h.bodies, string(body))
	h.mu.Unlock()
	if h.fn != nil {
		h.fn(w, r, body)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.bodies...)
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
