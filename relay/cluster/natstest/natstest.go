// Package natstest runs a cluster of real NATS servers with JetStream in
// the test's process, for the tests of calltap's relay cluster: routes and
// client ports on 127.0.0.1, stores in the test's temporary directory.
package natstest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is n NATS servers routed to each other.
type Cluster struct {
	t       testing.TB
	dir     string
	servers []*server.Server // nil while stopped
	ports   []int            // client port of each, kept across restarts
	routes  []int            // cluster port of each

	noAdvertise bool // set by StartUnadvertised

	// Set by StartProcesses: each server a process of its own.
	procs  []*exec.Cmd // nil while stopped
	stdins []io.Closer // each process's stdin, kept open: its end ends the server
}

// Start runs n servers and waits until JetStream has a leader.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, &Cluster{t: t, dir: t.TempDir(), servers: make([]*server.Server, n), ports: make([]int, n), routes: make([]int, n)})
}

// StartUnadvertised is Start with servers that do not tell clients of each
// other: a client given one URL (a proxy's) stays behind it, as the chaos
// run's nodes do, so that cutting the proxy cuts the client off.
func StartUnadvertised(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, &Cluster{t: t, dir: t.TempDir(), servers: make([]*server.Server, n), ports: make([]int, n), routes: make([]int, n), noAdvertise: true})
}

func start(t testing.TB, c *Cluster) *Cluster {
	t.Helper()
	n := len(c.servers)
	// JetStream's cluster wants its routes configured from the start, so
	// the route ports are chosen before any server starts.
	for i := range n {
		c.routes[i] = freePort(t)
	}
	for i := range n {
		c.start(i, -1, c.routes[i])
	}
	t.Cleanup(c.Shutdown)
	c.WaitReady()
	return c
}

func (c *Cluster) opts(i, port, routePort int) *server.Options {
	o := &server.Options{
		ServerName: fmt.Sprintf("nats-%d", i),
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(c.dir, fmt.Sprintf("nats-%d", i)),
		NoSigs:     true,
		NoLog:      true,
	}
	if len(c.routes) > 1 { // one server runs JetStream on its own, as a single NATS server does
		o.Cluster = server.ClusterOpts{Name: "calltap", Host: "127.0.0.1", Port: routePort, NoAdvertise: c.noAdvertise}
	}
	for j, rp := range c.routes {
		if j != i && rp > 0 {
			o.Routes = append(o.Routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", rp)})
		}
	}
	return o
}

func (c *Cluster) start(i, port, routePort int) {
	c.t.Helper()
	s, err := server.NewServer(c.opts(i, port, routePort))
	if err != nil {
		c.t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(60 * time.Second) {
		c.t.Fatalf("NATS server %d did not start", i)
	}
	c.servers[i] = s
	c.ports[i] = s.Addr().(*net.TCPAddr).Port
}

// URLs are the client URLs of every server, comma-separated, as
// `calltap relay --nats` takes them.
func (c *Cluster) URLs() string {
	var us []string
	for _, p := range c.ports {
		us = append(us, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	return strings.Join(us, ",")
}

// Stop shuts server i down, as if its machine died.
func (c *Cluster) Stop(i int) {
	if c.procs != nil {
		c.stopProcess(i)
		return
	}
	if s := c.servers[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.servers[i] = nil
	}
}

// Restart brings server i back on its ports with its store.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if c.procs != nil {
		if c.procs[i] == nil {
			c.startProcess(i)
		}
		return
	}
	if c.servers[i] == nil {
		c.start(i, c.ports[i], c.routes[i])
	}
}

// Shutdown stops every server.
func (c *Cluster) Shutdown() {
	for i := range c.servers {
		c.Stop(i)
	}
}

// WaitReady waits until JetStream answers with the servers now running.
func (c *Cluster) WaitReady() {
	c.t.Helper()
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	polltest.Until(c.t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	}, "JetStream did not elect a leader")
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
