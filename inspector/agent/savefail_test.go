package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// fullDisk makes the agent's commits fail the way a full disk does: from
// the first commit that saves {"seq":fillAt} or later until free is called.
type fullDisk struct {
	fillAt int
	filled chan struct{} // closed when the disk fills

	mu      sync.Mutex
	full    bool
	failed  int // commits refused
	updates int // responses in the refused commits
}

func (d *fullDisk) free() { d.mu.Lock(); d.full = false; d.mu.Unlock() }

func (d *fullDisk) refused() (commits, updates int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failed, d.updates
}

// newAgent builds an agent whose commits go through d.
func (d *fullDisk) newAgent(c agent.Config) (*agent.Agent, error) {
	store := c.Store
	return agent.NewWritingThrough(c, func(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error) {
		d.mu.Lock()
		for _, c := range inserts {
			var b struct{ Seq int }
			if json.Unmarshal(c.Body, &b) == nil && b.Seq >= d.fillAt && d.fillAt > 0 {
				d.full, d.fillAt = true, 0
				close(d.filled)
			}
		}
		if d.full {
			d.failed++
			d.updates += len(updates)
			d.mu.Unlock()
			return nil, fmt.Errorf("storage: insert capture: %w", syscall.ENOSPC)
		}
		d.mu.Unlock()
		return store.LogCaptures(ctx, inserts, updates)
	})
}

// When saves fail while the agent takes in the relay's queue, the tunnel
// carries on by itself once there is room again: every request reaches the
// handler once, in order, every answer is recorded, and a restart sends
// nothing a second time.
func TestQueuedRequestsRecoverFromFailedSaves(t *testing.T) {
	// The relay sends no more than a window (32) of queued requests before
	// the agent acknowledges one, so the first commit, which holds
	// {"seq":0}, succeeds; the handler answers it only once the disk is
	// full, so that recording its answer fails too.
	disk := &fullDisk{fillAt: 64, filled: make(chan struct{})}
	h := &handler{}
	var first sync.Once
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first.Do(func() {
			select {
			case <-disk.filled:
			case <-time.After(time.Minute):
			}
		})
		h.ServeHTTP(w, r)
	}))
	defer hs.Close()
	st := startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: disk.newAgent})
	st.StopAgent()
	const queued = 200
	for i := 0; i < queued; i++ {
		resp, err := http.Post(st.TunnelURL+"/hook", "application/json", strings.NewReader(fmt.Sprintf(`{"seq":%d}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d while away: %d", i, resp.StatusCode)
		}
	}
	st.StartAgent()
	polltest.Until(t, 10*time.Second, func() bool { _, updates := disk.refused(); return updates > 0 }, "the disk did not fill up")
	if h.count() >= queued {
		t.Fatal("every request was delivered though the disk was full")
	}
	disk.free()
	polltest.Until(t, 30*time.Second, func() bool { return h.count() >= queued }, "the tunnel did not recover once the disk had room")
	for i := queued; i < queued+3; i++ {
		send(t, st.TunnelURL+"/hook", fmt.Sprintf(`{"seq":%d}`, i))
	}
	checkSeqs(t, h, queued+3)

	// Every answer was recorded, so a restart has nothing left to send.
	if err := st.Agent.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	caps, count, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 300}})
	if err != nil {
		t.Fatal(err)
	}
	if count != queued+3 {
		t.Errorf("agent stored %d captures, want %d", count, queued+3)
	}
	for _, c := range caps {
		if c.Attempts != 1 || c.ResponseStatus != http.StatusOK {
			t.Errorf("capture %s: %d attempts, response %d recorded; want 1 attempt answered 200", c.ID, c.Attempts, c.ResponseStatus)
		}
	}
	st.StopAgent()
	st.StartAgent()
	send(t, st.TunnelURL+"/hook", fmt.Sprintf(`{"seq":%d}`, queued+3))
	checkSeqs(t, h, queued+4)
	if n := st.peer.held(); n != 0 {
		t.Errorf("relay still holds %d", n)
	}
}

// checkSeqs checks the handler got {"seq":0}…{"seq":n-1}, each once, in order.
func checkSeqs(t *testing.T, h *handler, n int) {
	t.Helper()
	h.mu.Lock()
	got := append([]string(nil), h.bodies...)
	h.mu.Unlock()
	bad := len(got) != n
	var order []string
	for i, b := range got {
		order = append(order, strings.TrimSuffix(strings.TrimPrefix(b, `{"seq":`), "}"))
		if i < n && b != fmt.Sprintf(`{"seq":%d}`, i) {
			bad = true
		}
	}
	if bad {
		t.Fatalf("the handler saw %d requests in this order, want 0…%d each once: %s", len(got), n-1, strings.Join(order, " "))
	}
}

func (d *fullDisk) fill() { d.mu.Lock(); d.full = true; d.mu.Unlock() }

// stampHandler is a local handler that counts the requests it got, by body.
type stampHandler struct {
	mu   sync.Mutex
	seen map[string]int // guarded by mu
}

func (h *stampHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.seen[string(b)]++
	h.mu.Unlock()
	io.WriteString(w, "ok")
}

// While commits fail, a live request is refused with 503, Retry-After and
// "disk full" (code disk_full) in the service's envelope, before it
// reaches the handler (those forwarded as the disk filled: outcome_unknown): a
// sender retrying each request as fast as it is refused costs the handler
// at most two copies of it (the one in flight when the disk filled, the
// one saved once there is room). Once there is room, the next request is
// taken.
func TestFullDiskRefusesBeforeTheHandler(t *testing.T) {
	disk := &fullDisk{filled: make(chan struct{})}
	h := &stampHandler{seen: map[string]int{}}
	hs := httptest.NewServer(h)
	defer hs.Close()
	st := startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: disk.newAgent})
	var (
		mu      sync.Mutex
		refused []string // the bodies of the answers that were not 200
		taken   int      // 200s after the disk was freed
		freed   bool
	)
	stop := make(chan struct{})
	var senders sync.WaitGroup
	for g := range 4 {
		senders.Go(func() {
			for n := 0; ; n++ {
				body := fmt.Sprintf(`{"id":"g%d-%d"}`, g, n)
				for {
					select {
					case <-stop:
						return
					default:
					}
					resp, err := http.Post(st.TunnelURL+"/hook", "application/json", strings.NewReader(body))
					if err != nil {
						t.Error(err)
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					mu.Lock()
					if resp.StatusCode == http.StatusOK && freed {
						taken++
					}
					if resp.StatusCode != http.StatusOK {
						refused = append(refused, fmt.Sprintf("%d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b))
					}
					mu.Unlock()
					if resp.StatusCode == http.StatusOK {
						break
					}
				}
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(refused) }
	polltest.Until(t, 30*time.Second, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return len(h.seen) > 20 }, "traffic did not flow")
	disk.fill()
	polltest.Until(t, 30*time.Second, func() bool { return count() >= 400 }, "the senders were not refused while the disk was full")
	mu.Lock()
	freed = true
	mu.Unlock()
	disk.free()
	polltest.Until(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return taken >= 20 }, "requests were not taken again once the disk had room")
	close(stop)
	senders.Wait()

	// The requests in flight when the disk filled (one per sender at
	// most) reached the handler before their commits failed: outcome
	// unknown. Every later one was refused before the handler.
	unknown := 0
	for _, r := range refused {
		if strings.HasPrefix(r, `503 Retry-After "5" {"status":false,"message":"the agent could not save the request (disk full on the agent's machine) after forwarding it`) &&
			strings.Contains(r, `"code":"outcome_unknown"`) {
			unknown++
			continue
		}
		if !strings.HasPrefix(r, `503 Retry-After "5" {"status":false,"message":"the agent could not save the request: disk full`) || !strings.Contains(r, `"code":"disk_full"`) {
			t.Errorf("refused with %s", r)
			break
		}
	}
	if unknown > 4 {
		t.Errorf("%d refusals said outcome unknown; only the 4 senders' requests in flight when the disk filled may", unknown)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for body, n := range h.seen {
		if n > 2 {
			t.Errorf("%s reached the handler %d times", body, n)
		}
	}
}

// A stop while the disk is full leaves nothing wrong: the answers the
// agent passed on but could not record (the request saved, the disk full
// by the time its answer came) are kept in the answer reserve, and the
// next start, with room again, records them: no capture is pending or
// answer-unknown, each says what its sender got.
func TestStopOnFullDiskKeepsTheAnswers(t *testing.T) {
	var full atomic.Bool
	var st *stack
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		// The disk fills while the handler works, once the request is saved.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if _, n, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{}); err == nil && n == 1 {
				break
			}
		}
		full.Store(true)
		w.Header().Set("X-Handler", "yes")
		w.WriteHeader(http.StatusCreated)
	}))
	defer hs.Close()
	st = startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: func(c agent.Config) (*agent.Agent, error) {
		store := c.Store
		return agent.NewWritingThrough(c, func(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error) {
			if full.Load() {
				return nil, fmt.Errorf("storage: append: %w", syscall.ENOSPC)
			}
			return store.LogCaptures(ctx, inserts, updates)
		})
	}})
	resp, err := http.Post(st.TunnelURL+"/hook", "application/json", strings.NewReader(`{"id":"answered"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("sender got %d, want the handler's 201", resp.StatusCode)
	}
	st.StopAgent() // the disk still full
	full.Store(false)
	st.StartAgent()
	caps, _, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if len(caps) != 1 {
		t.Fatalf("%d captures, want 1", len(caps))
	}
	c, err := st.AgentDB.Capture(context.Background(), caps[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != agentdb.StatusDelivered || c.ResponseStatus != http.StatusCreated || c.Attempts != 1 || !strings.Contains(c.ResponseHeaders, "X-Handler") {
		t.Errorf("capture after the restart: %s, response %d, %d attempts, headers %s, error %q; want delivered, the handler's 201",
			c.Status, c.ResponseStatus, c.Attempts, c.ResponseHeaders, c.Error)
	}
}

// A refusal says whether the handler may have the request: the live request
// whose commit fails after it was forwarded (the fast path overlaps the
// two) is answered 503 outcome_unknown, since the handler has it; the next
// one, committed first while saves fail, is answered 503 disk_full, and
// reaches the handler never. Alone in the tunnel (planAlone) and with a
// body kept apart (planAlongside, through the committer's loop) alike.
func TestRefusalSaysWhetherTheHandlerMayHaveIt(t *testing.T) {
	for name, pad := range map[string]string{"alone": "", "kept apart": strings.Repeat("x", 300<<10)} {
		t.Run(name, func(t *testing.T) {
			disk := &fullDisk{fillAt: 1, filled: make(chan struct{})}
			h := &stampHandler{seen: map[string]int{}}
			hs := httptest.NewServer(h)
			defer hs.Close()
			st := startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: disk.newAgent})
			body := fmt.Sprintf(`{"seq":1,"pad":"%s"}`, pad)
			seen := func() int { h.mu.Lock(); defer h.mu.Unlock(); return h.seen[body] }

			if code := refusedWith(t, st.TunnelURL+"/hook", body); code != "outcome_unknown" {
				t.Errorf("the commit failed after the forward: refused %q, want outcome_unknown", code)
			}
			if n := seen(); n != 1 {
				t.Fatalf("the handler got the first try %d times, want 1", n)
			}
			if code := refusedWith(t, st.TunnelURL+"/hook", body); code != "disk_full" {
				t.Errorf("saves failing, committed first: refused %q, want disk_full", code)
			}
			if n := seen(); n != 1 {
				t.Errorf("the handler got the request %d times after a refusal in save-first mode, want once", n)
			}
			disk.free()
			send(t, st.TunnelURL+"/hook", body)
			if n := seen(); n != 2 {
				t.Errorf("the handler got the request %d times once there was room, want twice", n)
			}
		})
	}
}

// refusedWith posts body to url, wants a 503 with Retry-After and the
// service's envelope, and returns its error code.
func refusedWith(t *testing.T, url, body string) string {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var env struct {
		Status bool
		Error  struct{ Code string }
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || json.Unmarshal(b, &env) != nil || env.Status {
		t.Fatalf("POST %s: %d, Retry-After %q: %.200s; want a 503 with Retry-After in the envelope", url, resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	return env.Error.Code
}
