package relay_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

func TestRefusedSendersCountAgainstRateLimit(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL,
		Relay: func(c *relay.Config) {
			// A token every 100 s: none comes back while the test runs.
			c.RateLimit, c.RateBurst = 0.01, 5
		},
		Client: func(c *tunnel.Config) { c.RequireHeaders = []string{"X-Secret: s3cret"} },
	})
	for i := 0; i < 5; i++ {
		resp, body := post(t, st.TunnelURL, "{}")
		if resp.StatusCode != 401 || errorCode(t, body) != "sender_not_accepted" {
			t.Fatalf("refusal %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := post(t, st.TunnelURL, "{}")
	if resp.StatusCode != 429 || errorCode(t, body) != "rate_limited" {
		t.Fatalf("after the burst of refusals: %d %s, want 429", resp.StatusCode, body)
	}
	// The flood spent the tunnel's allowance, a good sender included.
	req, _ := http.NewRequest("POST", st.TunnelURL, strings.NewReader("{}"))
	req.Header.Set("X-Secret", "s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || len(rec.all()) != 0 {
		t.Fatalf("good sender after the flood: %d, handler saw %d", resp.StatusCode, len(rec.all()))
	}
}

// floodRefused sends n requests without the required header from a few
// keep-alive connections and checks each is refused.
func floodRefused(t *testing.T, url string, n int) {
	t.Helper()
	const workers = 4
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += workers {
				resp, err := http.Post(url, "application/json", strings.NewReader("{}"))
				if err != nil {
					errs <- err.Error()
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 401 {
					errs <- resp.Status
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("a sender without the header got %s, want 401", e)
	}
}

func TestRefusalNoticesAreCoalesced(t *testing.T) {
	const interval = 300 * time.Millisecond
	st := stacktest.Start(t, stacktest.Options{ForwardTo: "http://127.0.0.1:1", NoAgent: true,
		Relay: func(c *relay.Config) {
			c.RateLimit, c.RateBurst = 1e6, 1e6
			c.NoticeInterval = interval
		}})
	d := websocket.Dialer{Subprotocols: []string{wire.Subprotocol}}
	hdr := http.Header{"Authorization": {"Bearer " + st.Token}, wire.RequireHeaderHeader: {"X-Secret: s3cret"}}
	ws, resp, err := d.Dial(strings.Replace(st.RelayURL, "http", "ws", 1)+wire.ConnectPath, hdr)
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	defer ws.Close()
	if _, b, err := ws.ReadMessage(); err != nil || b[0] != 0x01 {
		t.Fatalf("no hello: %v", err)
	}

	const n = 400
	start := time.Now()
	floodRefused(t, st.TunnelURL, n)
	// Every refusal is counted in the end, in a handful of notices.
	notices := 0
	ws.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("the agent was not told of all %d refusals (%d notices): %v", n, notices, err)
		}
		if b[0] != 0x05 {
			continue
		}
		notices++
		var nt wire.Notice
		if err := json.Unmarshal(b[1:], &nt); err != nil {
			t.Fatal(err)
		}
		if nt.Rejected == n {
			break
		}
	}
	// At most one notice per interval, the first at once.
	if most := int(time.Since(start)/interval) + 1; notices > most {
		t.Errorf("%d refusals sent %d notices to the agent, want at most %d (one per %s)", n, notices, most, interval)
	}
}

// slowSender posts a 100 kB body to path over and over, chunk bytes every
// 50 ms, until stop is closed; it counts the answers by status and error code.
type slowSender struct {
	addr, path string
	chunk      int

	mu      sync.Mutex
	answers map[string]int // "408 request_timeout" → count
	conns   map[net.Conn]bool
	closed  bool
	started atomic.Int32 // request heads sent
}

func (s *slowSender) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		conn, err := net.Dial("tcp", s.addr)
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.conns[conn] = true
		s.mu.Unlock()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n", s.path)
		s.started.Add(1)
		answered := make(chan struct{})
		go func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			chunk := bytes.Repeat([]byte("a"), s.chunk)
			for {
				select {
				case <-tick.C:
					if _, err := conn.Write(chunk); err != nil {
						return
					}
				case <-answered:
					return
				}
			}
		}()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		close(answered)
		if err == nil {
			var env struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			json.NewDecoder(resp.Body).Decode(&env)
			s.mu.Lock()
			s.answers[fmt.Sprintf("%d %s", resp.StatusCode, env.Error.Code)]++
			s.mu.Unlock()
		}
		conn.Close()
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
	}
}

func (s *slowSender) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
}

func TestSlowBodiesDoNotLockTheTunnel(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) {
		c.RateLimit, c.RateBurst = 1e6, 1e6
		c.MaxInFlight = 8
		c.BodyGrace = 200 * time.Millisecond
		c.MinBodyRate = 1000
		c.MaxSlowBodies = 4
	}})
	path := "/t/" + st.TunnelID + "/slow"
	// More senders than the tunnel has places for live requests: some far
	// below the minimum rate, some above it but slow.
	trickle := &slowSender{addr: st.RelayAddr, path: path, chunk: 1, answers: map[string]int{}, conns: map[net.Conn]bool{}}
	steady := &slowSender{addr: st.RelayAddr, path: path, chunk: 100, answers: map[string]int{}, conns: map[net.Conn]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		for _, s := range []*slowSender{trickle, steady} {
			wg.Add(1)
			go func() { defer wg.Done(); s.run(stop) }()
		}
	}
	defer func() {
		close(stop)
		trickle.closeAll()
		steady.closeAll()
		wg.Wait()
	}()
	polltest.Until(t, 10*time.Second, func() bool {
		return trickle.started.Load() >= 6 && steady.started.Load() >= 6
	}, "the slow senders did not start")

	// The tunnel keeps serving everyone else while they go on.
	for i := 0; i < 20; i++ {
		resp, body := post(t, st.TunnelURL+"/ok", "{}")
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d beside slow senders: %d %s", i, resp.StatusCode, body)
		}
	}
	for _, r := range rec.all() {
		if r.Path == "/slow" {
			t.Errorf("a slow body reached the handler (%d bytes)", len(r.Body))
		}
	}
	// Senders below the minimum rate are cut off.
	polltest.Until(t, 10*time.Second, func() bool {
		trickle.mu.Lock()
		defer trickle.mu.Unlock()
		return trickle.answers["408 request_timeout"] > 0
	}, "senders below the minimum rate were not answered 408")
	// Those above it beyond MaxSlowBodies are cut off as well.
	polltest.Until(t, 10*time.Second, func() bool {
		steady.mu.Lock()
		defer steady.mu.Unlock()
		return steady.answers["408 request_timeout"] > 0
	}, "slow senders beyond the tunnel's places were not answered 408")
}

// rawPost sends a request line exactly as given, so that no client cleans
// the path on the way, and returns the status and the body of the answer.
func rawPost(t *testing.T, addr, target string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", target)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("POST %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestDotSegmentsAreRefused(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL + "/wh"})
	prefix := "/t/" + st.TunnelID
	for _, p := range []string{
		"/../../admin",
		"/..",
		"/a/./b",
		"/%2e%2e/%2e%2e/admin",
		"/%2E%2E/admin",
		"/..%2f..%2fadmin",
		"/%2e%2e%2f%2e%2e%2fadmin",
		"/.%2e/admin",
		"/%2e./admin",
		"/..%5c..%5cadmin",
		"/%2e%2e%5cadmin",
		`/..\..\admin`,
		"/%252e%252e/admin",
		"/..;/admin",
		"/a/..?x=1",
	} {
		status, body := rawPost(t, st.RelayAddr, prefix+p)
		if status != http.StatusBadRequest || errorCode(t, body) != "invalid_request" || !strings.Contains(body, "dot") {
			t.Errorf("POST %s: %d %s, want 400 invalid_request", p, status, body)
		}
	}
	if got := rec.all(); len(got) != 0 {
		t.Errorf("the handler saw %d of them, the first at %s", len(got), got[0].Path)
	}
	var page struct {
		Data struct {
			Count int `json:"count"`
		} `json:"data"`
	}
	getJSON(t, st.InspectorURL+"/api/v1/ext/webhooks/", &page)
	if page.Data.Count != 0 {
		t.Errorf("the agent saved %d of them", page.Data.Count)
	}
	// Dots inside a segment are just names.
	status, body := rawPost(t, st.RelayAddr, prefix+"/.well-known/a..b/.c")
	if status != http.StatusCreated {
		t.Fatalf("a path with dots in names: %d %s", status, body)
	}
	if got := rec.all(); len(got) != 1 || got[0].Path != "/wh/.well-known/a..b/.c" {
		t.Errorf("the handler saw %+v", got)
	}
}
