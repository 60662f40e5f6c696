package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
)

// These tests run the real binary as separate processes, so that an agent
// can be frozen (SIGSTOP, a laptop asleep) or a relay killed (SIGKILL).

// builtBinary is a program of the module built once for the tests.
type builtBinary struct {
	pkg  string // as go build takes it, from this directory
	once sync.Once
	path string
	err  error
}

var calltapBuilt = &builtBinary{pkg: "."}

func calltapBinary(t *testing.T) string { return calltapBuilt.get(t) }

func (b *builtBinary) get(t *testing.T) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "calltap-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(b.pkg))
		if b.pkg == "." {
			b.path = filepath.Join(dir, "calltap")
		}
		out, err := exec.Command("go", "build", "-o", b.path, b.pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type proc struct {
	cmd *exec.Cmd
	out *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func start(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(calltapBinary(t), args...), out: &syncBuffer{}}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		p.cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", args[0], p.out.String())
		}
	})
	return p
}

type counter struct {
	mu     sync.Mutex
	bodies []string
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	c.bodies = append(c.bodies, string(b))
	c.mu.Unlock()
}

func (c *counter) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.bodies...)
}

func postStatus(url, body string) int {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestFrozenAgentAndKilledRelay(t *testing.T) {
	h := &counter{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	dir := t.TempDir()
	relayAddr := freeAddr(t)
	relayURL := "http://" + relayAddr
	relayArgs := []string{"relay", "--listen", relayAddr, "--insecure-http", "--public-url", relayURL, "--data", dir, "--pong-wait", "1s"}
	relayProc := start(t, relayArgs...)

	code, stdout, stderr := runCmd(t, "relay", "token", "create", "alice", "--data", dir, "--public-url", relayURL, "--json")
	if code != 0 {
		t.Fatalf("token create: %s", stderr)
	}
	var tok struct {
		Token string `json:"token"`
		URL   string `json:"url"`
	}
	json.Unmarshal([]byte(stdout), &tok)
	agent := start(t, "listen", "--relay", relayURL, "--token", tok.Token, "--forward-to", hs.URL, "--inspect", "", "--data", t.TempDir())
	polltest.Until(t, 15*time.Second, func() bool { return postStatus(tok.URL, `{"n":0}`) == 200 }, "tunnel did not come up")

	// A frozen laptop: the relay notices within its pong wait and queues.
	agent.cmd.Process.Signal(syscall.SIGSTOP)
	// Each try has its own body: a try the relay answered 503 (agent lost
	// before saving) may still reach the handler when the agent wakes and
	// reads what sat in its socket — the sender was told to retry, as with
	// the service's own retries. What was answered 202 must arrive exactly once.
	attempt := 0
	queued := func(n int) string {
		var body string
		polltest.Until(t, 45*time.Second, func() bool {
			attempt++
			body = fmt.Sprintf(`{"n":%d,"try":%d}`, n, attempt)
			return postStatus(tok.URL, body) == http.StatusAccepted
		}, "the relay did not notice the frozen agent and queue")
		return body
	}
	first := queued(1)
	// The laptop wakes: the agent reconnects by itself and the queue drains.
	agent.cmd.Process.Signal(syscall.SIGCONT)
	polltest.Until(t, 30*time.Second, func() bool {
		for _, b := range h.get() {
			if b == first {
				return true
			}
		}
		return false
	}, "the queued request was not delivered after the agent woke")

	// Kill the relay with a queue held, start it again: nothing lost.
	agent.cmd.Process.Signal(syscall.SIGSTOP)
	second := queued(2)
	relayProc.cmd.Process.Signal(syscall.SIGKILL)
	relayProc.cmd.Wait()
	start(t, relayArgs...)
	agent.cmd.Process.Signal(syscall.SIGCONT)
	polltest.Until(t, 30*time.Second, func() bool {
		for _, b := range h.get() {
			if b == second {
				return true
			}
		}
		return false
	}, "the request queued before the relay was killed was lost")
	// Each try is its own request: one answered 202 while the queue still
	// drains is delivered from the queue, and must be delivered once too.
	accepted := []string{first, second}
	polltest.Until(t, 15*time.Second, func() bool {
		attempt++
		body := fmt.Sprintf(`{"n":3,"try":%d}`, attempt)
		code := postStatus(tok.URL, body)
		if code == http.StatusOK || code == http.StatusAccepted {
			accepted = append(accepted, body)
		}
		return code == http.StatusOK
	}, "the same URL did not work after the relay restart")
	polltest.Until(t, 15*time.Second, func() bool {
		got := map[string]bool{}
		for _, b := range h.get() {
			got[b] = true
		}
		for _, b := range accepted {
			if !got[b] {
				return false
			}
		}
		return true
	}, "an accepted request was not delivered")
	counts := map[string]int{}
	for _, b := range h.get() {
		counts[b]++
	}
	for _, b := range accepted {
		if counts[b] != 1 {
			t.Errorf("%s delivered %d times", b, counts[b])
		}
	}
}
