package natstest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/nats-io/nats-server/v2/server"
)

// childEnv names the environment variable that turns a test binary
// started by StartProcesses into one NATS server (ServeIfChild).
const childEnv = "CALLTAP_NATSTEST_SERVER"

// childSpec is what a server process is told to be.
type childSpec struct {
	I      int   `json:"i"`
	Port   int   `json:"port"`
	Routes []int `json:"routes"` // every server's route port, this one's at I
	Dir    string
}

// StartProcesses runs n servers as processes of their own, each the test
// binary started again (its TestMain must call ServeIfChild first), so
// that a test can freeze one with SIGSTOP as an operator's machine would
// stall: its sockets stay open, the kernel keeps taking bytes for it, and
// nothing comes back until SIGCONT. It waits until JetStream has a leader.
func StartProcesses(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, dir: t.TempDir(), servers: make([]*server.Server, n), ports: make([]int, n), routes: make([]int, n), procs: make([]*exec.Cmd, n)}
	for i := range n {
		c.routes[i], c.ports[i] = freePort(t), freePort(t)
	}
	for i := range n {
		c.startProcess(i)
	}
	t.Cleanup(c.Shutdown)
	c.WaitReady()
	return c
}

func (c *Cluster) startProcess(i int) {
	c.t.Helper()
	spec, _ := json.Marshal(childSpec{I: i, Port: c.ports[i], Routes: c.routes, Dir: c.dir})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	// The server ends when its stdin does: with the test, however the
	// test ends.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.procs[i], c.stdins = cmd, append(c.stdins, stdin)
	addr := fmt.Sprintf("127.0.0.1:%d", c.ports[i])
	polltest.Until(c.t, 10*time.Second, func() bool {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}, fmt.Sprintf("NATS server process %d did not start", i))
}

// Freeze stops server process i with SIGSTOP; Thaw lets it go on.
func (c *Cluster) Freeze(i int) { c.signal(i, syscall.SIGSTOP) }

// Thaw continues server process i after Freeze.
func (c *Cluster) Thaw(i int) { c.signal(i, syscall.SIGCONT) }

func (c *Cluster) signal(i int, sig os.Signal) {
	c.t.Helper()
	if c.procs == nil || c.procs[i] == nil {
		c.t.Fatalf("NATS server %d is not a process of its own (StartProcesses)", i)
	}
	if err := c.procs[i].Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
}

// stopProcess ends server process i, frozen or not.
func (c *Cluster) stopProcess(i int) {
	cmd := c.procs[i]
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGCONT)
	cmd.Process.Kill()
	cmd.Wait()
	c.procs[i] = nil
}

// ServeIfChild runs the NATS server StartProcesses asked this process to
// be, until its stdin ends, and exits; in any other process it returns at
// once. A test package that uses StartProcesses calls it first thing in
// its TestMain.
func ServeIfChild() {
	v := os.Getenv(childEnv)
	if v == "" {
		return
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "natstest:", err)
		os.Exit(2)
	}
	c := &Cluster{dir: spec.Dir, routes: spec.Routes}
	s, err := server.NewServer(c.opts(spec.I, spec.Port, spec.Routes[spec.I]))
	if err != nil {
		fmt.Fprintln(os.Stderr, "natstest:", err)
		os.Exit(2)
	}
	go s.Start()
	io.Copy(io.Discard, os.Stdin)
	s.Shutdown()
	s.WaitForShutdown()
	os.Exit(0)
}
