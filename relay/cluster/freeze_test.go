package cluster_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
)

// freezer is a TCP proxy to one NATS server that can stop passing bytes,
// as a NATS server stopped with SIGSTOP does: connections stay open and
// nothing comes back.
type freezer struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	frozen bool
	thawed *sync.Cond
}

func startFreezer(t *testing.T, target string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	f.thawed = sync.NewCond(&f.mu)
	t.Cleanup(func() { f.thaw(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go f.pipe(c, s)
			go f.pipe(s, c)
		}
	}()
	return f
}

func (f *freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		f.mu.Lock()
		for f.frozen {
			f.thawed.Wait()
		}
		f.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() { f.mu.Lock(); f.frozen = true; f.mu.Unlock() }
func (f *freezer) thaw()   { f.mu.Lock(); f.frozen = false; f.thawed.Broadcast(); f.mu.Unlock() }

// A node whose NATS server freezes leaves it within seconds: /metrics and
// /healthz answer at once meanwhile, and a sender on that node is answered
// (live, 202, or 503 with Retry-After) without waiting out the freeze.
func TestFrozenNATSServer(t *testing.T) {
	nats := natstest.Start(t, 3)
	holder := startNode(t, nats, "holder", nil)
	info := token(t, holder, "alice")
	_, ts := startHandler(t, nil)
	startAgent(t, t.TempDir(), info.Token, ts.URL, holder)

	// Node f is given only the proxy to server 0; it learns the other
	// servers from that one, as nats.go does.
	fr := startFreezer(t, strings.TrimPrefix(strings.Split(nats.URLs(), ",")[0], "nats://"))
	f, flog := startNodeOver(t, "f", "nats://"+fr.ln.Addr().String())
	waitHeld(t, info, holder, f)
	if resp, body := post(t, tunnelURL(f, info), `{"n":"before"}`); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("before the freeze: %d %s", resp.StatusCode, body)
	}
	fr.freeze()
	start := time.Now()
	for _, path := range []string{"/metrics", "/healthz"} {
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(f.URL + path)
		if err != nil {
			t.Fatalf("%s while NATS is frozen: %v", path, err)
		}
		resp.Body.Close()
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("/metrics and /healthz took %s while NATS is frozen", d)
	}
	c := http.Client{Timeout: 60 * time.Second}
	resp, err := c.Post(tunnelURL(f, info), "application/json", strings.NewReader(`{"n":"frozen"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	waited := time.Since(start)
	t.Logf("a sender while NATS is frozen: %d after %s", resp.StatusCode, waited.Round(time.Millisecond))
	switch {
	case resp.StatusCode == http.StatusNoContent, resp.StatusCode == http.StatusAccepted:
	case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
	default:
		t.Errorf("a sender while NATS is frozen: %d %s", resp.StatusCode, b)
	}
	// Old: nats.go's default pings (2 min, 2 out) kept the node on the
	// frozen server for minutes. Generous for a loaded machine.
	if waited > 15*time.Second {
		t.Errorf("a sender while NATS is frozen waited %s", waited)
	}
	polltest.Until(t, 20*time.Second, func() bool {
		resp, _ := post(t, tunnelURL(f, info), `{"n":"after"}`)
		return resp.StatusCode == http.StatusNoContent
	}, "the node did not move to another NATS server")
	// A wait past 2 s is logged once, with what it waited on.
	stalls := map[string]int{}
	for _, line := range strings.Split(flog.String(), "\n") {
		if strings.Contains(line, `msg="waiting on NATS" for="the answer of another relay node"`) {
			_, req, _ := strings.Cut(line, " request=")
			stalls[req]++
		}
	}
	if len(stalls) == 0 {
		t.Error("the node did not log its forward stalled on the frozen server")
	}
	for req, n := range stalls {
		if n != 1 {
			t.Errorf("the stall of request %s was logged %d times, want once", req, n)
		}
	}
}

// startNodeOver runs a relay node connecting to NATS through urls.
func startNodeOver(t *testing.T, name, urls string) (*node, *capturedLog) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{name: name, URL: "http://" + ln.Addr().String()}
	log, captured := captureLog(t, "node "+name)
	c, err := cluster.Open(context.Background(), cluster.Options{URLs: urls, Replicas: 3, Node: name, Logger: log, RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := relay.NewServer(context.Background(), relay.Config{PublicURL: n.URL, Logger: log, Version: "test", ForwardTimeout: 5 * time.Second, Store: c, Cluster: c})
	if err != nil {
		t.Fatal(err)
	}
	n.c, n.srv = c, srv
	rctx, cancel := context.WithCancel(context.Background())
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
	return n, captured
}
