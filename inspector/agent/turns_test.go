package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// gate is a local handler that keeps the order it got requests in, by
// their "seq", and holds a request whose body says "hold" until open is
// called.
type gate struct {
	mu    sync.Mutex
	order []int         // guarded by mu
	held  chan struct{} // closed by open
	once  sync.Once     // open's
	at    chan int      // told each seq as it arrives
}

func newGate() *gate { return &gate{held: make(chan struct{}), at: make(chan int, 64)} }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var v struct {
		Seq  int
		Hold bool
	}
	json.Unmarshal(b, &v)
	g.mu.Lock()
	g.order = append(g.order, v.Seq)
	g.mu.Unlock()
	g.at <- v.Seq
	if v.Hold {
		<-g.held
	}
	fmt.Fprintf(w, "seq %d", v.Seq)
}

// open lets held requests through; again, it does nothing.
func (g *gate) open() { g.once.Do(func() { close(g.held) }) }

func (g *gate) seen() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.order...)
}

// arrived waits for the handler to get seq.
func (g *gate) arrived(t *testing.T, seq int) {
	t.Helper()
	select {
	case got := <-g.at:
		if got != seq {
			t.Fatalf("the handler got seq %d, want %d", got, seq)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("seq %d never reached the handler", seq)
	}
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// queueWhileAway stops the agent, posts bodies (the relay answers 202 and
// queues them) and starts the agent again.
func queueWhileAway(t *testing.T, st *stack, bodies ...string) {
	t.Helper()
	st.StopAgent()
	for _, b := range bodies {
		if code, _ := post(t, st.TunnelURL+"/hook", b); code != http.StatusAccepted {
			t.Fatalf("%s while the agent is away: %d, want 202", b, code)
		}
	}
	st.StartAgent()
}

// captureOf finds the capture whose body is body.
func captureOf(t *testing.T, st *stack, body string) *agentdb.Capture {
	t.Helper()
	caps, _, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 100}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range caps {
		full, err := st.AgentDB.Capture(context.Background(), c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if string(full.Body) == body {
			return full
		}
	}
	t.Fatalf("no capture of %s", body)
	return nil
}

// A live request that arrives while a queued one is at the handler waits
// for its turn, is saved meanwhile, and gets the handler's own answer
// when its turn comes before the relay's forward timeout.
func TestLiveRequestWaitsItsTurn(t *testing.T) {
	g := newGate()
	hs := httptest.NewServer(g)
	defer hs.Close()
	st := startStack(t, stackOptions{ForwardTo: hs.URL})
	queueWhileAway(t, st, `{"seq":0,"hold":true}`)
	g.arrived(t, 0)
	answered := make(chan string, 1)
	go func() {
		code, body := post(t, st.TunnelURL+"/hook", `{"seq":1}`)
		answered <- fmt.Sprintf("%d %s", code, body)
	}()
	// Saved while it waits: the store holds it before the handler does.
	polltest.Until(t, 10*time.Second, func() bool {
		_, n, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{})
		return err == nil && n == 2
	}, "the live request was not saved while it waited for its turn")
	select {
	case got := <-answered:
		t.Fatalf("the live request was answered %s before its turn", got)
	case <-time.After(50 * time.Millisecond):
	}
	if seen := g.seen(); len(seen) != 1 {
		t.Fatalf("the handler got %v while the queued request was at it", seen)
	}
	g.open()
	g.arrived(t, 1)
	if got := <-answered; got != "200 seq 1" {
		t.Errorf("the live request in turn was answered %s, want the handler's 200", got)
	}
	queued := captureOf(t, st, `{"seq":0,"hold":true}`)
	if !queued.Queued || queued.ArrivedAt.IsZero() {
		t.Errorf("the queued request's capture: queued %v, arrived %v; want it marked queued, with its arrival", queued.Queued, queued.ArrivedAt)
	}
	live := captureOf(t, st, `{"seq":1}`)
	if live.Queued {
		t.Error("a live request answered by the handler was marked queued")
	}
}

// A live request whose turn would come after the relay's forward timeout is
// answered "queued" (its sender gets 202) before it, marked queued, and
// delivered once in its turn, after the requests before it.
func TestLiveRequestInTurnIsDeferred(t *testing.T) {
	g := newGate()
	hs := httptest.NewServer(g)
	defer hs.Close()
	st := startStack(t, stackOptions{ForwardTo: hs.URL,
		ForwardTimeout: 2 * time.Second})
	queueWhileAway(t, st, `{"seq":0,"hold":true}`)
	g.arrived(t, 0)
	start := time.Now()
	code, _ := post(t, st.TunnelURL+"/hook", `{"seq":1}`)
	if code != http.StatusAccepted {
		t.Fatalf("a live request whose turn does not come in time: %d, want 202", code)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("answered queued after %s, before the margin (half the relay's 2 s timeout) ran out", waited)
	}
	live := captureOf(t, st, `{"seq":1}`)
	if !live.Queued || live.ArrivedAt.IsZero() {
		t.Errorf("the deferred request's capture: queued %v, arrived %v; want it marked queued, with its arrival", live.Queued, live.ArrivedAt)
	}
	g.open()
	g.arrived(t, 1)
	polltest.Until(t, 10*time.Second, func() bool {
		c := captureOf(t, st, `{"seq":1}`)
		return c.Attempts == 1 && c.ResponseStatus == 200
	}, "the deferred request's answer was never recorded")
	if seen := g.seen(); len(seen) != 2 {
		t.Errorf("the handler saw %v, want each request once", seen)
	}
}

// Drain takes no more turns: the request at the handler finishes, the live
// ones waiting for their turn are then answered "queued", as is one that
// arrives after the drain, at once; the next start sends them, in their
// order, once each.
func TestDrainDefersLiveRequestsInTheLine(t *testing.T) {
	g := newGate()
	hs := httptest.NewServer(g)
	defer hs.Close()
	defer g.open() // a failure lets the held request go: Close waits for it
	st := startStack(t, stackOptions{ForwardTo: hs.URL})
	queueWhileAway(t, st, `{"seq":0,"hold":true}`)
	g.arrived(t, 0)
	waiting := make(chan int, 1)
	go func() { code, _ := post(t, st.TunnelURL+"/hook", `{"seq":1}`); waiting <- code }()
	polltest.Until(t, 10*time.Second, func() bool {
		_, n, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{})
		return err == nil && n == 2
	}, "the live request was not saved")
	st.Agent.Drain()
	if code, _ := post(t, st.TunnelURL+"/hook", `{"seq":2}`); code != http.StatusAccepted {
		t.Fatalf("a live request after the drain: %d, want 202", code)
	}
	select {
	case code := <-waiting:
		t.Fatalf("the live request waiting behind the one at the handler was answered %d before that one finished", code)
	default:
	}
	g.open()
	if code := <-waiting; code != http.StatusAccepted {
		t.Fatalf("the live request waiting at the drain: %d, want 202", code)
	}
	st.StopAgent()
	if seen := g.seen(); fmt.Sprint(seen) != "[0]" {
		t.Fatalf("the drained agent sent %v, want only the one at the handler", seen)
	}
	st.StartAgent()
	g.arrived(t, 1)
	g.arrived(t, 2)
	if seen := g.seen(); fmt.Sprint(seen) != "[0 1 2]" {
		t.Errorf("the handler saw %v, want [0 1 2]", seen)
	}
}

// A queued request that cannot be read back for its turn (a full disk
// stops the store applying its intake log) keeps its turn: the live
// request behind it waits, and reaches the handler after it once the read
// works again. Chaos run team seed 3301 saw the turn dropped instead, and
// the requests after it at the handler 84 s before it.
func TestQueuedTurnKeptWhileItCannotBeRead(t *testing.T) {
	g := newGate()
	hs := httptest.NewServer(g)
	defer hs.Close()
	var (
		mu     sync.Mutex
		broken = true
		fails  = make(chan struct{}, 64)
	)
	newAgent := func(cfg agent.Config) (*agent.Agent, error) {
		store := cfg.Store
		return agent.NewLoadingThrough(cfg, func(ctx context.Context, id string) (*agentdb.Capture, error) {
			mu.Lock()
			defer mu.Unlock()
			if broken {
				select {
				case fails <- struct{}{}:
				default:
				}
				return nil, fmt.Errorf("storage: commit: %w", syscall.ENOSPC)
			}
			return store.Capture(ctx, id)
		})
	}
	st := startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: newAgent})
	queueWhileAway(t, st, `{"seq":0}`)
	<-fails // its turn came, and the read failed
	answered := make(chan string, 1)
	go func() {
		code, body := post(t, st.TunnelURL+"/hook", `{"seq":1}`)
		answered <- fmt.Sprintf("%d %s", code, body)
	}()
	polltest.Until(t, 10*time.Second, func() bool {
		_, n, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{})
		return err == nil && n == 2
	}, "the live request was not saved while it waited")
	for len(fails) > 0 { // failures from before the live request was saved
		<-fails
	}
	select { // read again, and failed again, with the live request saved behind it
	case <-fails:
	case seq := <-g.at:
		t.Fatalf("the handler got seq %d while the queued request before it could not be read", seq)
	case <-time.After(30 * time.Second):
		t.Fatal("the queued request's read was not tried again")
	}
	if seen := g.seen(); len(seen) != 0 {
		t.Fatalf("the handler got %v while the queued request before them could not be read", seen)
	}
	mu.Lock()
	broken = false
	mu.Unlock()
	g.arrived(t, 0)
	g.arrived(t, 1)
	if got := <-answered; got != "200 seq 1" && !strings.HasPrefix(got, "202 ") {
		t.Errorf("the live request was answered %s, want the handler's 200 (or 202 queued)", got)
	}
}

// A live request that arrives after the drain, behind one at the handler,
// is answered "queued" at once: not when the one at the handler ends, nor
// when the relay's forward timeout is about to run out (here both ten
// minutes away).
func TestDrainAnswersALateArrivalAtOnce(t *testing.T) {
	g := newGate()
	hs := httptest.NewServer(g)
	defer hs.Close()
	defer g.open() // a failure lets the held request go: Close waits for it
	st := startStack(t, stackOptions{ForwardTo: hs.URL,
		ForwardTimeout: 10 * time.Minute,
		Agent:          func(c *agent.Config) { c.ForwardTimeout = 10 * time.Minute }}) // the held request's too
	queueWhileAway(t, st, `{"seq":0,"hold":true}`)
	g.arrived(t, 0)
	st.Agent.Drain()
	answered := make(chan int, 1)
	go func() { code, _ := post(t, st.TunnelURL+"/hook", `{"seq":1}`); answered <- code }()
	select {
	case code := <-answered:
		if code != http.StatusAccepted {
			t.Errorf("a live request after the drain: %d, want 202", code)
		}
	case <-time.After(polltest.MinWait):
		t.Fatal("a live request after the drain was not answered while the one before it was at the handler")
	}
	if seen := g.seen(); fmt.Sprint(seen) != "[0]" {
		t.Errorf("the drained agent sent %v, want only the one at the handler", seen)
	}
}

// Once the turn line has run, live requests wait for no turn: the line is
// empty, and two live requests reach the handler together, the first
// still held there when the second arrives.
func TestLiveRequestsRunAlongsideOnceTheLineHasRun(t *testing.T) {
	g := newGate()
	hs := httptest.NewServer(g)
	defer hs.Close()
	defer g.open() // a failure lets the held request go: Close waits for it
	st := startStack(t, stackOptions{ForwardTo: hs.URL})
	queueWhileAway(t, st, `{"seq":0}`)
	g.arrived(t, 0)
	polltest.Until(t, 10*time.Second, func() bool { return agent.WaitingTurns(st.Agent) == 0 }, "the turn line to empty once its one request was sent")
	codes := make(chan int, 2)
	go func() { code, _ := post(t, st.TunnelURL+"/hook", `{"seq":1,"hold":true}`); codes <- code }()
	g.arrived(t, 1)
	go func() { code, _ := post(t, st.TunnelURL+"/hook", `{"seq":2}`); codes <- code }()
	g.arrived(t, 2) // while seq 1 is held
	if code := <-codes; code != http.StatusOK {
		t.Errorf("the second live request: %d, want the handler's 200", code)
	}
	g.open()
	if code := <-codes; code != http.StatusOK {
		t.Errorf("the held live request: %d, want the handler's 200", code)
	}
}

// counted is a slog.Handler counting the records whose message begins
// with prefix.
type counted struct {
	prefix string
	mu     sync.Mutex
	n      int // guarded by mu
}

func (c *counted) Enabled(context.Context, slog.Level) bool { return true }
func (c *counted) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *counted) WithGroup(string) slog.Handler            { return c }
func (c *counted) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, c.prefix) {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
	return nil
}

func (c *counted) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// A saved request that cannot be read back for its turn is logged once for
// its whole streak of failed reads, at the first, not at every try.
func TestUnreadableTurnLoggedOnce(t *testing.T) {
	g := newGate()
	hs := httptest.NewServer(g)
	defer hs.Close()
	var (
		mu     sync.Mutex
		broken = true
		fails  = make(chan struct{}, 64)
	)
	newAgent := func(cfg agent.Config) (*agent.Agent, error) {
		store := cfg.Store
		return agent.NewLoadingThrough(cfg, func(ctx context.Context, id string) (*agentdb.Capture, error) {
			mu.Lock()
			defer mu.Unlock()
			if broken {
				select {
				case fails <- struct{}{}:
				default:
				}
				return nil, fmt.Errorf("storage: commit: %w", syscall.ENOSPC)
			}
			return store.Capture(ctx, id)
		})
	}
	logged := &counted{prefix: "reading a saved request back"}
	st := startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: newAgent,
		Agent: func(c *agent.Config) { c.Logger = slog.New(logged) }})
	queueWhileAway(t, st, `{"seq":0}`)
	for i := range 3 {
		select {
		case <-fails:
		case <-time.After(polltest.MinWait):
			t.Fatalf("read %d of the queued request never came", i+1)
		}
	}
	mu.Lock()
	broken = false
	mu.Unlock()
	g.arrived(t, 0)
	if n := logged.count(); n != 1 {
		t.Errorf("three failed reads logged %d times, want once", n)
	}
}
