package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is one child process of the topology (a NATS server, a relay node,
// the agent) that the nemesis may signal, kill and start again with the
// same arguments. Its output goes to a log file of the run's folder.
type proc struct {
	name string
	bin  string
	args []string
	logf string // path of its output, appended to across restarts

	mu   sync.Mutex
	cmd  *exec.Cmd     // guarded by mu; nil before the first start
	done chan struct{} // guarded by mu; closed when cmd has exited
	exit error         // guarded by mu; cmd's exit, once done is closed
}

// start runs the process. Pdeathsig kills it if the chaos program dies
// without cleaning up (a SIGKILL of the runner itself).
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !isClosed(p.done) {
		return fmt.Errorf("%s: already running", p.name)
	}
	out, err := os.OpenFile(p.logf, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "=== chaos: start %s at %s\n", p.name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("%s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.exit = cmd, done, nil
	go func() {
		err := cmd.Wait()
		out.Close()
		p.mu.Lock()
		p.exit = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// running reports whether the process is alive (frozen counts as alive).
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !isClosed(p.done)
}

// signal sends sig to the running process; a process not running is not
// an error (the nemesis may aim at one that has just died).
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || isClosed(p.done) {
		return
	}
	p.cmd.Process.Signal(sig)
}

// wait waits up to d for the process to exit and reports whether it has.
func (p *proc) wait(d time.Duration) bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	p.wait(time.Minute)
}

// term stops the process in order: SIGCONT first (a frozen process cannot
// act on SIGTERM), SIGTERM, then SIGKILL after grace.
func (p *proc) term(grace time.Duration) (clean bool) {
	p.signal(syscall.SIGCONT)
	p.signal(syscall.SIGTERM)
	if p.wait(grace) {
		return true
	}
	slog.Warn("did not stop in time after SIGTERM; killing", "proc", p.name, "grace", grace)
	p.kill()
	return false
}

// exitErr is how the last run of the process ended (nil while running or
// after a clean exit).
func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// freePorts finds n distinct ports free on 127.0.0.1 now: listened on,
// then closed, to be given to child processes and proxies.
func freePorts(n int) ([]int, error) {
	var (
		ports []int
		lns   []net.Listener
	)
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
