package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a child process the suite started (relay, agent, handler).
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
	err  error         // set before done closes
}

// startProc starts bin with args; stdout goes to out (nil: discarded), and
// stderr to the log file logPath, so a failure can be read afterwards.
func startProc(name, logPath string, out io.Writer, bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = out
	if logPath != "" {
		f, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		cmd.Stderr = f
		defer f.Close() // the child holds its own descriptor
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the suite
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits; SIGKILL after 5 s.
func (p *proc) stop() {
	if p == nil || p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// clockTick is USER_HZ, which the Linux ABI fixes at 100 for /proc.
const clockTick = 10 * time.Millisecond

// procCPU is the process's user+system CPU time so far (/proc/<pid>/stat).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("unreadable /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state is field 3 of stat(5), so utime (14) and stime (15)
	// are at 11 and 12 here.
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("unreadable /proc stat times")
	}
	return time.Duration(ut+st) * clockTick, nil
}

// procStatus reads one "Vm…: N kB" line of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) (int64, error) {
	path := "/proc/self/status"
	if pid > 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		fields := strings.Fields(rest)
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, err
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n <<= 10
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s: no %s", path, field)
}

// freePort finds a loopback port nobody listens on right now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// poll calls cond every interval until it holds or within passes.
func poll(ctx context.Context, within, interval time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %s", within, what)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(interval)
	}
	return nil
}

var httpc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8}}

func getOK(url string) bool {
	resp, err := httpc.Get(url)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func getBody(url string) ([]byte, error) {
	resp, err := httpc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, err
}

// startHandler runs `benchrun handler` as its own process and returns it
// with its base URL.
func startHandler(workdir string) (*proc, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	pr, pw := io.Pipe()
	p, err := startProc("handler", filepath.Join(workdir, "handler.log"), pw, self, "handler")
	if err != nil {
		return nil, "", err
	}
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				select {
				case got <- u:
				default:
				}
			}
		}
	}()
	select {
	case u := <-got:
		return p, u, nil
	case <-time.After(10 * time.Second):
		p.stop()
		return nil, "", errors.New("the handler did not start")
	}
}

// calltap is a relay and an agent started from bin/calltap, as a developer
// runs them, in front of the handler.
type calltap struct {
	bin        string
	dir        string
	relay      *proc
	agent      *proc
	relayPort  int
	relayURL   string
	token      string
	tunnelPath string // /t/<id>
	inspectURL string
	relayArgs  []string
	agentArgs  []string // more flags for `calltap listen` (e.g. --sync normal)
	forwardTo  string
}

// relayFlagsNoLimits raises the per-tunnel abuse limits, which would
// otherwise throttle a benchmark (that is their job).
var relayFlagsNoLimits = []string{"--rate-limit", "1000000000", "--rate-burst", "1000000000", "--max-in-flight", "100000"}

// newCalltap creates the relay's data directory and a token; nothing runs yet.
func newCalltap(ctx context.Context, bin, dir, forwardTo string, relayArgs ...string) (*calltap, error) {
	c, err := newNode(bin, dir, forwardTo, relayArgs...)
	if err != nil {
		return nil, err
	}
	if err := c.createToken(ctx, "--data", filepath.Join(dir, "relay")); err != nil {
		return nil, err
	}
	return c, nil
}

// newNode is a relay and its agent on a free port, without a token yet.
func newNode(bin, dir, forwardTo string, relayArgs ...string) (*calltap, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return &calltap{bin: bin, dir: dir, relayPort: port, relayURL: fmt.Sprintf("http://127.0.0.1:%d", port),
		relayArgs: relayArgs, forwardTo: forwardTo}, nil
}

// createToken mints the agent's token in the token store named by where
// (--data DIR, or --nats URLS).
func (c *calltap) createToken(ctx context.Context, where ...string) error {
	args := append([]string{"relay", "token", "create", "bench", "--public-url", c.relayURL, "--json"}, where...)
	out, err := exec.CommandContext(ctx, c.bin, args...).Output()
	if err != nil {
		return fmt.Errorf("relay token create: %w", err)
	}
	var info struct {
		Token string `json:"token"`
		URL   string `json:"url"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return fmt.Errorf("relay token create --json: %w", err)
	}
	c.token = info.Token
	c.tunnelPath = strings.TrimPrefix(info.URL, c.relayURL)
	return nil
}

// startRelay starts the relay process and waits until it answers /healthz.
func (c *calltap) startRelay(ctx context.Context) error {
	args := append([]string{"relay", "--listen", fmt.Sprintf("127.0.0.1:%d", c.relayPort), "--insecure-http",
		"--public-url", c.relayURL, "--data", filepath.Join(c.dir, "relay")}, c.relayArgs...)
	p, err := startProc("relay", filepath.Join(c.dir, "relay.log"), nil, c.bin, args...)
	if err != nil {
		return err
	}
	c.relay = p
	return poll(ctx, 10*time.Second, 5*time.Millisecond, "the relay did not answer /healthz (see "+filepath.Join(c.dir, "relay.log")+")", func() bool {
		return !p.exited() && getOK(c.relayURL+"/healthz")
	})
}

// startAgent starts `calltap listen` on a fresh data directory (or the
// existing one) and, when wait is set, waits until its tunnel is connected.
func (c *calltap) startAgent(ctx context.Context, wait bool) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	c.inspectURL = fmt.Sprintf("http://127.0.0.1:%d", port)
	// The console line per request goes to /dev/null: the agent still
	// formats and writes it, as it does in a terminal.
	args := append([]string{"listen", "--relay", c.relayURL, "--token", c.token,
		"--forward-to", c.forwardTo + "/webhooks", "--data", filepath.Join(c.dir, "agent"), "--inspect", fmt.Sprintf("127.0.0.1:%d", port)}, c.agentArgs...)
	p, err := startProc("agent", filepath.Join(c.dir, "agent.log"), nil, c.bin, args...)
	if err != nil {
		return err
	}
	c.agent = p
	if !wait {
		return nil
	}
	return c.waitConnected(ctx, 15*time.Second)
}

func (c *calltap) waitConnected(ctx context.Context, within time.Duration) error {
	return poll(ctx, within, 5*time.Millisecond, "the agent did not connect (see "+filepath.Join(c.dir, "agent.log")+")", func() bool {
		b, err := getBody(c.inspectURL + "/api/v1/ext/tunnel/")
		return err == nil && bytes.Contains(b, []byte(`"state":"connected"`))
	})
}

func (c *calltap) stop() {
	c.agent.stop()
	c.relay.stop()
}

// relayMetric reads one gauge or counter from the relay's /metrics.
func (c *calltap) relayMetric(name string) (float64, error) {
	b, err := getBody(c.relayURL + "/metrics")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("relay /metrics has no %s", name)
}
