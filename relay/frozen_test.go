package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// frozenPeer is an agent written by hand that stops reading, as a stopped
// process does, on a request whose body is freezeOn: it answers no ping
// then, and no request, until resumed. A live request whose body is
// unreachable it answers as an agent whose handler is down. It delivers
// (to its handler, as it were) each request id once.
type frozenPeer struct {
	conn        *frameconn.Conn
	freezeOn    string
	unreachable string
	froze       chan struct{} // closed when it stops reading
	resume      chan struct{} // closed by the test

	mu        sync.Mutex
	seen      map[string]bool // guarded by mu: request ids received
	delivered []string        // guarded by mu: bodies, at their first arrival
	arrivals  []arrival       // guarded by mu: every request frame, in the order read
}

type arrival struct {
	id, body string
	queued   bool
}

func dialFrozenPeer(t *testing.T, st *stacktest.Stack, freezeOn string) *frozenPeer {
	t.Helper()
	h := http.Header{"Authorization": {"Bearer " + st.Token}}
	d := websocket.Dialer{Subprotocols: []string{wire.Subprotocol}}
	conn, _, err := frameconn.Dial(context.Background(), d, strings.Replace(st.RelayURL, "http", "ws", 1)+wire.ConnectPath, h, wire.DefaultMaxFrame, frameconn.Keepalive{})
	if err != nil {
		t.Fatal(err)
	}
	p := &frozenPeer{conn: conn, freezeOn: freezeOn, froze: make(chan struct{}), resume: make(chan struct{}), seen: map[string]bool{}}
	buf, err := conn.ReadFrame()
	if err != nil || buf.Bytes()[0] != wire.FrameHello {
		t.Fatalf("no hello: %v", err)
	}
	frameconn.PutBuf(buf)
	var loops sync.WaitGroup
	loops.Go(conn.SendLoop)
	loops.Go(p.readLoop)
	t.Cleanup(func() {
		conn.Close(nil)
		loops.Wait()
	})
	return p
}

func (p *frozenPeer) readLoop() {
	for {
		buf, err := p.conn.ReadFrame()
		if err != nil {
			return
		}
		if buf.Bytes()[0] != wire.FrameRequest {
			frameconn.PutBuf(buf) // notices
			continue
		}
		req, err := wire.DecodeRequest(buf.Bytes())
		if err != nil {
			frameconn.PutBuf(buf)
			return
		}
		body := string(req.Body)
		frameconn.PutBuf(buf)
		if body == p.freezeOn && !req.Queued {
			close(p.froze)
			<-p.resume
		}
		down := body == p.unreachable && !req.Queued
		p.take(req.ID, body, req.Queued, down)
		switch {
		case req.Queued:
			p.conn.Send(frameconn.Frame{Head: wire.AppendAck(nil, wire.Ack{Stream: req.Stream})}, nil)
		case down:
			p.conn.Send(frameconn.Frame{Head: wire.AppendResponseHead(nil, &wire.Response{Stream: req.Stream, Result: wire.ResultUnreachable, Error: "connection refused"})}, nil)
		default:
			p.conn.Send(frameconn.Frame{Head: wire.AppendResponseHead(nil, &wire.Response{Stream: req.Stream, Status: http.StatusOK}), Body: []byte(body)}, nil)
		}
	}
}

// take records a request, and delivers it unless it came before, or its
// handler is down.
func (p *frozenPeer) take(id, body string, queued, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.arrivals = append(p.arrivals, arrival{id, body, queued})
	if !p.seen[id] && !down {
		p.seen[id] = true
		p.delivered = append(p.delivered, body)
	}
}

func (p *frozenPeer) snapshot() (delivered []string, arrivals []arrival) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.delivered...), append([]arrival(nil), p.arrivals...)
}

// An agent that stops reading with live requests in flight is taken for
// frozen: the senders of those requests, and of the ones after them, are
// answered 202 rather than kept waiting for the forward timeout (30 s
// here). When it reads again it gets every request once, in order: the
// live ones it was sent, then what arrived after the verdict, and live
// requests reach it again. The queued copy of a live one it answers is
// not sent; that of one it could not hand its handler is.
func TestFrozenAgentIsAwayAndGetsEverythingOnceWhenItWakes(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	body := func(i int) string { return fmt.Sprintf(`{"n":%d}`, i) }
	const before, inFlight, after = 3, 3, 5
	p := dialFrozenPeer(t, st, body(before))
	p.unreachable = body(before + 1)
	for i := range before {
		if resp, got := post(t, st.TunnelURL, body(i)); resp.StatusCode != http.StatusOK || got != body(i) {
			t.Fatalf("request %d before the freeze: %d %s", i, resp.StatusCode, got)
		}
	}

	sendInFlight(t, st, p, body, before, inFlight)
	for i := before + inFlight; i < before+inFlight+after; i++ {
		resp, got := post(t, st.TunnelURL, body(i))
		queuedID(t, resp, got)
	}
	if m := getBody(t, st.RelayURL+"/metrics"); !strings.Contains(m, "calltap_agents_frozen_total 1\n") {
		t.Errorf("/metrics does not count the frozen agent:\n%s", m)
	}

	// Once it reads again, requests queue behind the others until the
	// queue has drained and the relay knows it woke; then they are live.
	close(p.resume)
	total := before + inFlight + after
	polltest.Until(t, 30*time.Second, func() bool {
		resp, got := post(t, st.TunnelURL, body(total))
		total++
		return resp.StatusCode == http.StatusOK && got == body(total-1)
	}, "live requests do not reach the agent again after it woke")
	polltest.Until(t, 30*time.Second, func() bool {
		delivered, _ := p.snapshot()
		return len(delivered) >= total
	}, "the requests queued while the agent was frozen were not all delivered")
	delivered, arrivals := p.snapshot()
	checkDeliveredInOrder(t, delivered, body, before, inFlight, total)
	checkCopies(t, arrivals, []string{p.unreachable})
}

// A frozen agent whose connection then dies gets nothing it was sent
// live: the copies queued at the verdict reach its next connection, each
// once, before the requests that arrived after the verdict.
func TestFrozenAgentThatNeverWakesGetsTheCopies(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	body := func(i int) string { return fmt.Sprintf(`{"n":%d}`, i) }
	const inFlight, after = 3, 3
	frozen := dialFrozenPeer(t, st, body(0))
	sendInFlight(t, st, frozen, body, 0, inFlight)
	for i := inFlight; i < inFlight+after; i++ {
		resp, got := post(t, st.TunnelURL, body(i))
		queuedID(t, resp, got)
	}
	frozen.conn.Close(nil) // the lid never opens again: the connection is cut
	close(frozen.resume)

	next := dialFrozenPeer(t, st, "")
	polltest.Until(t, 30*time.Second, func() bool {
		delivered, _ := next.snapshot()
		return len(delivered) >= inFlight+after
	}, "the copies and the requests queued after them were not delivered on the next connection")
	delivered, arrivals := next.snapshot()
	for _, a := range arrivals {
		if !a.queued {
			t.Errorf("%s came live to the next connection", a.body)
		}
	}
	if len(arrivals) != inFlight+after {
		t.Errorf("the next connection got %d request frames for %d requests", len(arrivals), inFlight+after)
	}
	checkDeliveredInOrder(t, delivered, body, 0, inFlight, inFlight+after)
}

// sendInFlight sends request first, which freezes p, and the n-1 after it
// at once, and checks that each sender is answered 202: none waits for
// the frozen agent.
func sendInFlight(t *testing.T, st *stacktest.Stack, p *frozenPeer, body func(int) string, first, n int) {
	t.Helper()
	answers := []chan *http.Response{postBodyAsync(st.TunnelURL, body(first))}
	<-p.froze
	for i := first + 1; i < first+n; i++ {
		answers = append(answers, postBodyAsync(st.TunnelURL, body(i)))
	}
	for i, ch := range answers {
		if resp := <-ch; resp == nil || resp.StatusCode != http.StatusAccepted {
			t.Errorf("request %d, in flight to the frozen agent: %v, want 202", first+i, resp)
		}
	}
}

// checkDeliveredInOrder checks that each of total requests was
// delivered once, in the order they were sent: the inFlight ones from
// before on, sent at once, together in any order (their senders sent
// them concurrently), after the ones before and before the ones after.
func checkDeliveredInOrder(t *testing.T, delivered []string, body func(int) string, before, inFlight, total int) {
	t.Helper()
	if len(delivered) != total {
		t.Fatalf("delivered %d requests, want %d: %v", len(delivered), total, delivered)
	}
	for i := range total {
		if i >= before && i < before+inFlight {
			if !slices.Contains(delivered[before:before+inFlight], body(i)) {
				t.Fatalf("request %d in flight was not delivered with the others in flight: %v", i, delivered)
			}
		} else if delivered[i] != body(i) {
			t.Fatalf("delivered out of order: %v", delivered)
		}
	}
}

// checkCopies checks that of the requests that came live, those of
// copied, and only those, came again, once, as queued copies; and none
// came live twice.
func checkCopies(t *testing.T, arrivals []arrival, copied []string) {
	t.Helper()
	var copies []string
	live := map[string]bool{}
	for _, a := range arrivals {
		switch {
		case !a.queued && live[a.id]:
			t.Errorf("%s came live twice", a.body)
		case !a.queued:
			live[a.id] = true
		case live[a.id]:
			copies = append(copies, a.body)
		}
	}
	slices.Sort(copies)
	want := slices.Clone(copied)
	slices.Sort(want)
	if !slices.Equal(copies, want) {
		t.Errorf("copies after their live frames: %v; want %v", copies, want)
	}
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	return readAll(resp)
}
