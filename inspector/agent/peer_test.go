package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// peer is the relay's end of one tunnel, written from the protocol in
// relay/wire and nothing else: these tests drive the agent through a real
// websocket and its real tunnel client without importing the relay
// server (cmd/e2e runs the two together). It does what the agent sees of
// a relay:
//
//   - a sender's request goes to the connected agent, and the sender gets
//     its answer (502 for an unreachable handler, 504 when the forward
//     timeout runs out first, 202 for an answer "queued");
//   - with no agent, one that is leaving, or requests still queued ahead,
//     the request is kept in the offline queue and its sender gets 202;
//   - a connecting agent is sent the queue in arrival order, at most
//     peerWindow of it unacknowledged, and a queued request is forgotten
//     once acknowledged, so that one sent but not acknowledged goes again
//     on the next connection;
//   - an agent's Leave is answered GoAway "left", after which the
//     connection carries no request.
type peer struct {
	tunnelID       string
	forwardTimeout time.Duration
	log            *slog.Logger
	hs             *httptest.Server
	url            string        // where senders post: <hs>/t/<tunnelID>
	kick           chan struct{} // cap 1: the queue grew
	ids            atomic.Int64  // numbers request ids

	mu     sync.Mutex
	conn   *peerConn    // guarded by mu: the agent taking requests; nil while none is
	queue  []peerQueued // guarded by mu: the offline queue, oldest first
	queued int64        // guarded by mu: the seq of the last request queued
}

// peerQueued is a request in the offline queue.
type peerQueued struct {
	seq int64
	req *wire.Request
}

// peerWindow bounds the queued requests sent but not acknowledged, as a
// relay does (so that a failing save leaves the rest of the queue unsent).
const peerWindow = 32

// newPeer starts a peer whose forward timeout is forwardTimeout (30 s, a
// relay's default, when 0), logging to log (nowhere when nil).
func newPeer(t testing.TB, forwardTimeout time.Duration, log *slog.Logger) *peer {
	if forwardTimeout == 0 {
		forwardTimeout = 30 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &peer{tunnelID: "tn_test", forwardTimeout: forwardTimeout, log: log, kick: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc(wire.ConnectPath, p.serveAgent)
	mux.HandleFunc("/t/"+p.tunnelID+"/", p.serveSender)
	p.hs = httptest.NewServer(mux)
	p.url = p.hs.URL + "/t/" + p.tunnelID
	t.Cleanup(p.hs.Close) // after the agent's stop, registered later
	return p
}

// held is how many requests the offline queue holds.
func (p *peer) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// serveSender takes a sender's request: forwarded to the agent when it may
// go now, else queued.
func (p *peer) serveSender(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	req := &wire.Request{
		ID:        fmt.Sprintf("req_%d", p.ids.Add(1)),
		ArrivedAt: time.Now().UnixMicro(),
		Method:    r.Method,
		URI:       strings.TrimPrefix(r.URL.RequestURI(), "/t/"+p.tunnelID),
		Header:    wire.HeaderFrom(r.Header, r.Host),
		Body:      body,
	}
	p.mu.Lock()
	c := p.conn
	if len(p.queue) > 0 {
		c = nil // a live request does not overtake the queue
	}
	p.mu.Unlock()
	if c != nil && c.forward(w, r.Context(), req) {
		return
	}
	p.enqueue(req)
	w.WriteHeader(http.StatusAccepted)
	io.WriteString(w, `{"status":true,"message":"queued"}`)
}

// enqueue keeps req for the agent's next connection, or its drain.
func (p *peer) enqueue(req *wire.Request) {
	p.mu.Lock()
	p.queued++
	p.queue = append(p.queue, peerQueued{seq: p.queued, req: req})
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// nextQueued is the oldest queued request after seq after, if any.
func (p *peer) nextQueued(after int64) (peerQueued, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, q := range p.queue {
		if q.seq > after {
			return q, true
		}
	}
	return peerQueued{}, false
}

// forget takes a request the agent saved off the queue.
func (p *peer) forget(seq int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, q := range p.queue {
		if q.seq == seq {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			return
		}
	}
}

// serveAgent holds one agent's websocket until it ends.
func (p *peer) serveAgent(w http.ResponseWriter, r *http.Request) {
	up := websocket.Upgrader{Subprotocols: []string{wire.Subprotocol}}
	fc, err := frameconn.Accept(&up, w, r, wire.DefaultMaxFrame, frameconn.Keepalive{})
	if err != nil {
		return
	}
	if n, err := strconv.ParseInt(r.Header.Get(wire.MaxFrameHeader), 10, 64); err == nil && n > 0 {
		fc.SetPeerMax(n)
	}
	c := &peerConn{p: p, fc: fc, live: map[uint64]*peerLive{}, sent: map[uint64]int64{}, window: make(chan struct{}, peerWindow)}
	p.mu.Lock()
	p.conn = c
	queued := len(p.queue)
	p.mu.Unlock()
	var loops sync.WaitGroup
	loops.Go(fc.SendLoop)
	fc.TrySend(frameconn.Frame{Head: wire.AppendHello(nil, &wire.Hello{
		TunnelID: p.tunnelID, Name: "test", PublicURL: p.url, MaxBody: 10 << 20, MaxFrame: wire.DefaultMaxFrame,
		Queued: queued, Version: "test", ForwardTimeoutMS: p.forwardTimeout.Milliseconds(), Leave: true,
	})})
	loops.Go(c.drain)
	fc.Close(c.read(&loops))
	loops.Wait()
	p.mu.Lock()
	if p.conn == c {
		p.conn = nil
	}
	p.mu.Unlock()
}

// peerConn is the peer's end of one agent's websocket.
type peerConn struct {
	p      *peer
	fc     *frameconn.Conn
	stream atomic.Uint64 // numbers the requests sent
	window chan struct{} // a place per queued request sent and not yet acknowledged

	// intake is read-held while a request frame is sent, and write-held to
	// set leaving: the GoAway answering a Leave follows every request
	// sent on this connection.
	intake  sync.RWMutex
	leaving bool // guarded by intake

	mu   sync.Mutex           // guards live and sent
	live map[uint64]*peerLive // guarded by mu: live requests waiting, by stream
	sent map[uint64]int64     // guarded by mu: queued requests sent, stream → queue seq
}

// peerLive is a live request waiting for the agent's answer.
type peerLive struct {
	acked atomic.Bool
	resp  chan *wire.Response // cap 1
}

// send sends req on a new stream unless the agent is leaving (false).
// Before the frame goes, onStream learns its stream.
func (c *peerConn) send(req *wire.Request, onStream func(uint64)) bool {
	c.intake.RLock()
	defer c.intake.RUnlock()
	if c.leaving {
		return false
	}
	req.Stream = c.stream.Add(1)
	onStream(req.Stream)
	c.fc.Send(frameconn.Frame{Head: wire.AppendRequestHead(nil, req), Body: req.Body}, nil)
	return true
}

// forward hands req to the agent and gives the sender its answer; false,
// with nothing written, when the agent is leaving: the request is to be
// queued.
func (c *peerConn) forward(w http.ResponseWriter, sender context.Context, req *wire.Request) bool {
	l := &peerLive{resp: make(chan *wire.Response, 1)}
	sent := c.send(req, func(stream uint64) {
		c.mu.Lock()
		c.live[stream] = l
		c.mu.Unlock()
	})
	if !sent {
		return false
	}
	defer func() {
		c.mu.Lock()
		delete(c.live, req.Stream)
		c.mu.Unlock()
	}()
	timeout := time.NewTimer(c.p.forwardTimeout)
	defer timeout.Stop()
	select {
	case resp := <-l.resp:
		answer(w, resp)
	case <-timeout.C:
		c.p.log.Warn("local handler too slow", "timeout", c.p.forwardTimeout, "saved", l.acked.Load())
		w.WriteHeader(http.StatusGatewayTimeout)
	case <-c.fc.Done():
		w.WriteHeader(http.StatusBadGateway)
	case <-sender.Done():
	}
	return true
}

// answer gives a sender the agent's response, as a relay does.
func answer(w http.ResponseWriter, resp *wire.Response) {
	switch resp.Result {
	case wire.ResultOK:
		for _, f := range resp.Header {
			if !strings.EqualFold(f.Name, "Content-Length") && !strings.EqualFold(f.Name, "Transfer-Encoding") && !strings.EqualFold(f.Name, "Connection") {
				w.Header().Add(f.Name, f.Value)
			}
		}
		w.WriteHeader(resp.Status)
		w.Write(resp.Body)
	case wire.ResultTimeout:
		w.WriteHeader(http.StatusGatewayTimeout)
	case wire.ResultQueued:
		w.WriteHeader(http.StatusAccepted)
	default: // unreachable, or an answer too large
		w.WriteHeader(http.StatusBadGateway)
	}
}

// drain sends the agent the offline queue in arrival order, keeping at
// most peerWindow unacknowledged, until the connection ends or the agent
// leaves.
func (c *peerConn) drain() {
	var after int64 // the seq of the last queued request sent
	for {
		q, ok := c.p.nextQueued(after)
		if !ok {
			select {
			case <-c.p.kick:
				continue
			case <-c.fc.Done():
				return
			}
		}
		select {
		case c.window <- struct{}{}:
		case <-c.fc.Done():
			return
		}
		req := *q.req
		req.Queued = true
		sent := c.send(&req, func(stream uint64) {
			c.mu.Lock()
			c.sent[stream] = q.seq
			c.mu.Unlock()
		})
		if !sent {
			return
		}
		after = q.seq
	}
}

// read is the connection's one reader: it returns why the connection
// ended. What it starts, loops waits for.
func (c *peerConn) read(loops *sync.WaitGroup) error {
	for {
		buf, err := c.fc.ReadFrame()
		if err != nil {
			return err
		}
		b := bytesCopy(buf.Bytes())
		frameconn.PutBuf(buf)
		switch b[0] {
		case wire.FrameAck:
			err = c.onAck(b)
		case wire.FrameResponse:
			err = c.onResponse(b)
		case wire.FrameLeave:
			loops.Go(c.leave) // it waits for a request frame being sent
		default:
			err = fmt.Errorf("%w: frame type 0x%02x", wire.ErrMalformed, b[0])
		}
		if err != nil {
			return err
		}
	}
}

// onAck takes an Ack frame.
func (c *peerConn) onAck(b []byte) error {
	a, err := wire.DecodeAck(b)
	if err == nil {
		c.acked(a.Stream)
	}
	return err
}

// onResponse hands a Response frame to the sender waiting for it; a
// queued request's answer, or one whose sender left, has nobody to go to.
func (c *peerConn) onResponse(b []byte) error {
	r, err := wire.DecodeResponse(b)
	if err != nil {
		return err
	}
	if l := c.liveOf(r.Stream); l != nil {
		l.resp <- r
	}
	return nil
}

// bytesCopy is b in memory of its own, for a frame whose buffer goes back
// to the pool.
func bytesCopy(b []byte) []byte { return append([]byte(nil), b...) }

// acked notes the agent's word that it saved the request of stream: a
// live one's sender may learn it, a queued one leaves the queue.
func (c *peerConn) acked(stream uint64) {
	if l := c.liveOf(stream); l != nil {
		l.acked.Store(true)
	} else if seq, ok := c.takeSent(stream); ok {
		c.p.forget(seq)
		<-c.window // room for the next queued request
	}
}

// liveOf is the live request of stream still waiting, or nil.
func (c *peerConn) liveOf(stream uint64) *peerLive {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live[stream]
}

// takeSent is the queue seq of the queued request sent on stream, which
// it forgets: an ack comes once.
func (c *peerConn) takeSent(stream uint64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq, ok := c.sent[stream]
	delete(c.sent, stream)
	return seq, ok
}

// leave answers an agent's Leave: no request follows the GoAway.
func (c *peerConn) leave() {
	c.intake.Lock()
	c.leaving = true
	c.intake.Unlock()
	c.p.mu.Lock()
	if c.p.conn == c {
		c.p.conn = nil
	}
	c.p.mu.Unlock()
	err := c.fc.Send(frameconn.Frame{Head: wire.AppendGoAway(nil, wire.GoAway{Reason: wire.GoAwayLeft, Message: "no more requests"})}, nil)
	if err != nil && !errors.Is(err, frameconn.ErrClosed) {
		c.p.log.Warn("goaway", "err", err)
	}
}
