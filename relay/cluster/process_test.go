package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
)

// TestMain lets this test binary, started again by a test, be one NATS
// server (natstest.StartProcesses) or one relay node (startNodeProcess):
// what a test freezes with SIGSTOP must be a process of its own.
func TestMain(m *testing.M) {
	natstest.ServeIfChild()
	serveNodeIfChild()
	os.Exit(m.Run())
}

// nodeEnv names the environment variable that makes this test binary a
// relay node; its value is a nodeSpec.
const nodeEnv = "CALLTAP_TEST_RELAY_NODE"

type nodeSpec struct {
	Name string `json:"name"`
	NATS string `json:"nats"` // the NATS servers' URLs
	Addr string `json:"addr"` // where to listen
}

// nodeProc is a relay node in a process of its own.
type nodeProc struct {
	name, URL string
	cmd       *exec.Cmd
	stdin     io.Closer // its end ends the node
	log       *capturedLog
}

// startNodeProcess runs a relay node as a process of its own, set up as
// startNode sets one up, and waits until it answers its health check.
func startNodeProcess(t *testing.T, natsURLs, name string) *nodeProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	spec, _ := json.Marshal(nodeSpec{Name: name, NATS: natsURLs, Addr: addr})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeEnv+"="+string(spec))
	_, captured := captureLog(t, "node "+name)
	cmd.Stderr = lockedWriter{&captured.mu, &captured.buf}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &nodeProc{name: name, URL: "http://" + addr, cmd: cmd, stdin: stdin, log: captured}
	t.Cleanup(p.stop)
	polltest.Until(t, 30*time.Second, func() bool {
		resp, err := http.Get(p.URL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "relay node process "+name+" did not come up")
	return p
}

func (p *nodeProc) freeze() { p.cmd.Process.Signal(syscall.SIGSTOP) }
func (p *nodeProc) thaw()   { p.cmd.Process.Signal(syscall.SIGCONT) }

// stop ends the node in order (stdin closed), or kills it after a while.
func (p *nodeProc) stop() {
	p.thaw()
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// serveNodeIfChild runs the relay node a test asked this process to be,
// until its stdin ends, and exits.
func serveNodeIfChild() {
	v := os.Getenv(nodeEnv)
	if v == "" {
		return
	}
	var spec nodeSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "relay node:", err)
		os.Exit(2)
	}
	if err := serveNode(spec); err != nil {
		fmt.Fprintln(os.Stderr, "relay node:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveNode(spec nodeSpec) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx := context.Background()
	c, err := cluster.Open(ctx, cluster.Options{URLs: spec.NATS, Replicas: 3, Node: spec.Name, Logger: log, RequestTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	url := "http://" + spec.Addr
	srv, err := relay.NewServer(ctx, relay.Config{PublicURL: url, Logger: log, Version: "test", ForwardTimeout: 5 * time.Second, Store: c, Cluster: c})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", spec.Addr)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	hs := srv.HTTPServer(spec.Addr)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(rctx) })
	wg.Go(func() { hs.Serve(ln) })
	io.Copy(io.Discard, os.Stdin)
	cancel()
	hs.Close()
	wg.Wait()
	return nil
}
