package relay_test

import (
	"bytes"
	"context"
	"fmt"
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
)

// notConnected reports the first state change other than "connected" that
// the agent's client went through: a reconnect shows up as one.
func notConnected(st *stacktest.Stack) (tunnel.ConnState, bool) {
	for {
		select {
		case cs := <-st.States:
			if cs.State != tunnel.StateConnected {
				return cs, true
			}
		default:
			return tunnel.ConnState{}, false
		}
	}
}

// An answer larger than the relay takes fails alone: its sender gets a 502
// naming the limit, the capture says why, and the requests in flight beside
// it on the same websocket get their answers.
func TestLargeAnswerFailsAloneAndTunnelStaysUp(t *testing.T) {
	const maxBody = 1 << 20
	big := bytes.Repeat([]byte("x"), 3<<20)
	var inside atomic.Int32
	release := make(chan struct{})
	var releaseOnce sync.Once
	_, h := startHandler(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Write(big)
			return
		}
		inside.Add(1)
		<-release
		fmt.Fprintf(w, "answer for %s", r.URL.Path)
	})
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) { c.MaxBody = maxBody }})

	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			path := fmt.Sprintf("/small%d", i)
			resp, err := http.Post(st.TunnelURL+path, "text/plain", strings.NewReader("x"))
			if err != nil {
				errs <- err
				return
			}
			b := readAll(resp)
			if resp.StatusCode != 200 || b != "answer for "+path {
				errs <- fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
			}
		}(i)
	}
	polltest.Until(t, 10*time.Second, func() bool { return inside.Load() == n }, "the small requests were not in flight together")

	resp, body := post(t, st.TunnelURL+"/big", "{}")
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "bad_gateway" || !strings.Contains(body, "1048576") {
		t.Errorf("the large answer: %d %s, want 502 bad_gateway naming the limit", resp.StatusCode, body)
	}

	releaseOnce.Do(func() { close(release) })
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if cs, ok := notConnected(st); ok {
		t.Errorf("the agent's connection changed state: %s (%v)", cs.State, cs.Err)
	}

	var page struct {
		Data struct {
			Results []struct {
				Path   string `json:"path"`
				Status string `json:"status"`
				Error  string `json:"error"`
			} `json:"results"`
		} `json:"data"`
	}
	getJSON(t, st.InspectorURL+"/api/v1/ext/webhooks/?limit=100", &page)
	found := false
	for _, c := range page.Data.Results {
		if c.Path != "/big" {
			continue
		}
		found = true
		if c.Status != "failed" || !strings.Contains(c.Error, "1048576") {
			t.Errorf("capture of the large answer: status %q error %q, want failed with the limit named", c.Status, c.Error)
		}
	}
	if !found {
		t.Error("no capture of the large answer")
	}
}

// A request larger than the agent reads is refused at the relay (413), not
// written to the websocket, which the agent would close.
func TestRequestLargerThanAgentReadsIsRefused(t *testing.T) {
	_, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL,
		Relay:  func(c *relay.Config) { c.MaxBody = 4 << 20 },
		Client: func(c *tunnel.Config) { c.MaxFrame = 1 << 20 },
	})
	resp, err := http.Post(st.TunnelURL+"/big", "application/octet-stream", bytes.NewReader(make([]byte, 2<<20)))
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(resp)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || errorCode(t, body) != "payload_too_large" {
		t.Errorf("a request over the agent's limit: %d %s, want 413 payload_too_large", resp.StatusCode, body)
	}
	resp, body = post(t, st.TunnelURL+"/small", "{}")
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("the next request: %d %s", resp.StatusCode, body)
	}
	if cs, ok := notConnected(st); ok {
		t.Errorf("the agent's connection changed state: %s (%v)", cs.State, cs.Err)
	}
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return b.String()
}

// bigAnswerer answers /big with more than the relay takes and anything
// else with its path, straight from ServeTunnel: no check of its own.
type bigAnswerer struct{}

func (bigAnswerer) ServeTunnel(r *wire.Request, s *tunnel.Stream) {
	defer s.Release()
	if !r.Queued {
		s.Ack()
	}
	body := []byte("answer for " + r.URI)
	if r.URI == "/big" {
		body = make([]byte, 3<<20)
	}
	s.Respond(&wire.Response{Status: 200, Body: body})
}

// Stream.Respond refuses, by itself, to write what the relay would not
// read: the request fails alone and the connection stays.
func TestRespondKeepsWithinRelayLimits(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true, Relay: func(c *relay.Config) { c.MaxBody = 1 << 20 }})
	var connects, losses atomic.Int32
	c, err := tunnel.NewClient(tunnel.Config{RelayURL: st.RelayURL, Token: st.Token, Handler: bigAnswerer{},
		OnState: func(cs tunnel.ConnState) {
			switch {
			case cs.State == tunnel.StateConnected && cs.Hello != nil && cs.Notice == (wire.Notice{}):
				connects.Add(1)
			case cs.State != tunnel.StateConnected:
				losses.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	polltest.Until(t, 10*time.Second, func() bool { return connects.Load() == 1 }, "the client did not connect")

	resp, body := post(t, st.TunnelURL+"/big", "{}")
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "bad_gateway" || !strings.Contains(body, "1048576") {
		t.Errorf("the large answer: %d %s, want 502 bad_gateway naming the limit", resp.StatusCode, body)
	}
	resp, body = post(t, st.TunnelURL+"/small", "{}")
	if resp.StatusCode != 200 || body != "answer for /small" {
		t.Errorf("the next request: %d %s", resp.StatusCode, body)
	}
	if n, l := connects.Load(), losses.Load(); n != 1 || l != 0 {
		t.Errorf("%d connections, %d losses; want the one connection kept", n, l)
	}
}

// A queued request larger than the connecting agent reads stays in the
// relay's queue, and the requests queued behind it still reach the handler,
// in order, over a connection that stays up.
func TestQueuedRequestLargerThanAgentReadsDoesNotStallTheQueue(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, NoAgent: true,
		Relay:  func(c *relay.Config) { c.MaxBody = 4 << 20 },
		Client: func(c *tunnel.Config) { c.MaxFrame = 1 << 20 },
	})
	for _, body := range []string{`{"seq":0}`, strings.Repeat("x", 2<<20), `{"seq":1}`} {
		resp, b := post(t, st.TunnelURL+"/hook", body)
		queuedID(t, resp, b)
	}
	st.StartAgent()
	polltest.Until(t, 10*time.Second, func() bool { return len(rec.all()) >= 2 }, "the requests queued behind the large one were not delivered")
	if got := rec.all(); len(got) != 2 || string(got[0].Body) != `{"seq":0}` || string(got[1].Body) != `{"seq":1}` {
		t.Fatalf("the handler saw %d requests, want {\"seq\":0} then {\"seq\":1}", len(got))
	}
	// The relay forgets the two the agent saved once it has read their
	// acks; the large one stays.
	polltest.Until(t, 10*time.Second, func() bool {
		stats, err := st.RelayDB.QueueStatsByTunnel(context.Background())
		return err == nil && stats[st.TunnelID].Count == 1
	}, "the relay's queue does not hold just the large request")
	if left, err := st.RelayDB.QueuedAfter(context.Background(), st.TunnelID, 0, 10); err != nil || len(left) != 1 || len(left[0].Body) != 2<<20 {
		t.Errorf("the relay kept %d requests (%v), want the large one", len(left), err)
	}
	if cs, ok := notConnected(st); ok {
		t.Errorf("the agent's connection changed state: %s (%v)", cs.State, cs.Err)
	}
}
