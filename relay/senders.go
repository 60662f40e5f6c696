// What a sender meets before its request goes anywhere: the tunnel
// route, the rate limit, the required header, the path check and the
// paced read of its body.

package relay

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/tunnelpath"
	"github.com/calltap/calltap/relay/wire"
	"github.com/google/uuid"
)

// serveSender takes a sender's request to /t/<tunnel>/... to the tunnel's
// agent, or to its offline queue.
func (s *Server) serveSender(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), "/t/")
	id, uri, _ := strings.Cut(rest, "/")
	uri = "/" + uri
	pathErr := tunnelpath.Check(uri)
	if r.URL.RawQuery != "" {
		uri += "?" + r.URL.RawQuery
	}
	if !validTunnelID(id) {
		// Seats are the relay's to choose, not a sender's: no seat id
		// (<tunnel>-<key>) is a path.
		s.refuse(w, r, api.NotFound("tunnel"))
		return
	}
	t, err := s.lookupTunnel(r.Context(), id)
	if err != nil {
		// The service retries a 5xx: what cannot be looked up now is not lost.
		s.log.Error("tunnel lookup", "tunnel", id, "err", err)
		w.Header().Set("Retry-After", "5")
		s.refuse(w, r, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay could not read its tokens; retry later"))
		return
	}
	if t == nil {
		s.refuse(w, r, api.NotFound("tunnel"))
		return
	}
	// A logger per request, made only when something is logged: slog's
	// With formats its attributes at once, which a hot path cannot afford.
	log := reqLogger{s.log, t.id, ""}

	// Refused senders spend the tunnel's allowance too: refusing is work,
	// and a flood must be cut off by the rate limit whatever it carries.
	if !s.cfg.NoRateLimit {
		if wait, ok := t.allow(time.Now()); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			s.refuse(w, r, api.Errorf(http.StatusTooManyRequests, api.CodeRateLimited, "too many requests for this tunnel"))
			return
		}
	}
	for _, f := range s.requiredHeaders(t) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(f.Name)), []byte(f.Value)) != 1 {
			t.rejected.Add(1)
			t.notifyRefused()
			log.Info("sender refused: required header missing or wrong", "header", f.Name)
			s.refuse(w, r, api.Errorf(http.StatusUnauthorized, api.CodeHeaderRejected, "the %s header is missing or wrong", f.Name))
			return
		}
	}
	if pathErr != nil {
		// The path is appended to the base path of the agent's local
		// handler: a "." or ".." segment could lead out of it.
		log.Info("sender refused: path", "uri", uri, "reason", pathErr)
		s.refuse(w, r, api.Invalid("the path after the tunnel id %v", pathErr))
		return
	}
	if r.ContentLength > s.cfg.MaxBody {
		s.refuse(w, r, api.Errorf(http.StatusRequestEntityTooLarge, api.CodeTooLarge, "body larger than %d bytes", s.cfg.MaxBody))
		return
	}
	buf, bodyErr := s.readBody(w, r, t)
	if bodyErr != nil {
		if bodyErr.Status == http.StatusRequestTimeout {
			log.Info("slow sender cut off", "reason", bodyErr.Message)
		}
		s.refuse(w, r, bodyErr)
		return
	}
	select {
	case t.inflight <- struct{}{}:
		defer func() { <-t.inflight }()
	default:
		frameconn.PutBuf(buf)
		w.Header().Set("Retry-After", "1")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "too many requests in flight for this tunnel"))
		return
	}
	s.metrics.bytesIn.Add(int64(buf.Len()))
	req := &wire.Request{
		ID:        uuid.NewString(),
		ArrivedAt: time.Now().UnixMicro(),
		Method:    r.Method,
		URI:       uri,
		Header:    wire.HeaderFrom(r.Header, r.Host),
		Body:      buf.Bytes(),
	}
	log.request = req.ID
	s.toSeat(w, r, t, req, buf, log)
}

// toSeat hands req, a request for token t, to its seat's agent: here, on
// the node holding it, or in its queue.
func (s *Server) toSeat(w http.ResponseWriter, r *http.Request, t *tunnel, req *wire.Request, buf *bytes.Buffer, log reqLogger) {
	seat, e := s.seatOf(r.Context(), t, req)
	if e != nil {
		frameconn.PutBuf(buf)
		w.Header().Set("Retry-After", "2")
		s.fail(w, e)
		return
	}
	if node := s.remoteHolder(seat); node != "" && !seat.held() {
		defer frameconn.PutBuf(buf)
		s.forwardToNode(w, r, seat, node, req, log)
		return
	}
	s.forwardOrQueue(w, r.Context(), seat, req, buf, log)
}

// forwardOrQueue hands req to the agent connected here, or queues it while none
// is, or while it is taken for frozen (frozen.go), or while the queue
// still drains (a live request must not overtake queued ones), or while
// this node's lease in the cluster has lapsed (other nodes may be
// queueing behind its back). ctx is the sender's.
func (s *Server) forwardOrQueue(w http.ResponseWriter, ctx context.Context, t *tunnel, req *wire.Request, buf *bytes.Buffer, log reqLogger) {
	t.mu.Lock()
	ac := t.agent
	live := ac != nil && t.queued == 0
	t.mu.Unlock()
	if ac != nil && ac.away() {
		live = false
	}
	live = live && s.cfg.Cluster.Leased()
	if live {
		// The pooled buffer backs req.Body until the frame is written; the
		// round trip returns only after that.
		s.forward(w, ctx, ac, req, buf, log)
		return
	}
	defer frameconn.PutBuf(buf)
	s.enqueue(w, ctx, t, req, log)
}

// held reports whether an agent holds t on this node.
func (t *tunnel) held() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.agent != nil
}

// counts reports whether this node counts t's queue: an agent holds t
// here, or is taking it (its hold is stored, its count under way).
func (t *tunnel) counts() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.agent != nil || t.taking > 0
}

// refuse answers e to a sender whose body was not read whole, and closes
// the connection: the answer goes out at once, whatever the body does
// (net/http would otherwise read up to 256 KiB of it first, for as long as
// a slow sender takes), and what the sender still writes is read and
// dropped for a while before the close (a lingering close, as nginx does),
// so that a client that writes its whole body before it reads gets this
// answer rather than a reset.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, e *api.Error) {
	if r.ContentLength == 0 {
		s.fail(w, e) // no body: the connection can serve the next request
		return
	}
	w.Header().Set("Connection", "close")
	s.fail(w, e)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	s.linger(rc, r.Body)
}

// lingerIdle is how long a lingering close waits for the next bytes.
const lingerIdle = 2 * time.Second

// linger reads and drops what is left of body, until it ends, or for
// Config.LingerTime, or after Config.LingerBytes, or when the next 64 KiB
// take longer than lingerIdle to come.
func (s *Server) linger(rc *http.ResponseController, body io.Reader) {
	end := time.Now().Add(s.cfg.LingerTime)
	for left := s.cfg.LingerBytes; left > 0; {
		d := time.Now().Add(lingerIdle)
		if d.After(end) {
			d = end
		}
		if rc.SetReadDeadline(d) != nil {
			return
		}
		n, err := io.CopyN(io.Discard, body, min(left, 64<<10))
		left -= n
		if err != nil || n == 0 {
			break
		}
	}
	// The server closes the body too: it must not wait for it again.
	rc.SetReadDeadline(time.Now())
}

// readBody reads a sender's body into a pooled buffer, holding the sender
// to Config.MinBodyRate after Config.BodyGrace and to one of the tunnel's
// places for slow bodies once the grace is over (see Config).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, t *tunnel) (*bytes.Buffer, *api.Error) {
	now := time.Now()
	p := &bodyPacer{body: r.Body, rc: http.NewResponseController(w), slowBodies: t.slowBodies,
		start: now, end: now.Add(s.readTimeout()), grace: s.cfg.BodyGrace, rate: float64(s.cfg.MinBodyRate)}
	var body io.Reader = p
	if p.rc.SetReadDeadline(p.deadline()) != nil {
		body = r.Body // a connection without deadlines cannot be paced
	} else {
		p.timer = time.AfterFunc(p.grace, p.graceOver)
	}
	buf, err := readAllPooled(body, s.cfg.MaxBody)
	cut := p.finish(err == nil)
	switch {
	case err == nil:
		return buf, nil // cut or not: it came whole
	case errors.Is(err, errTooLarge):
		return nil, api.Errorf(http.StatusRequestEntityTooLarge, api.CodeTooLarge, "body larger than %d bytes", s.cfg.MaxBody)
	case cut:
		return nil, api.Errorf(http.StatusRequestTimeout, api.CodeRequestTimeout,
			"the body was still arriving after %s and this tunnel is reading as many slow bodies as it may; send it faster or retry later", s.cfg.BodyGrace)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, api.Errorf(http.StatusRequestTimeout, api.CodeRequestTimeout,
			"the body arrived too slowly: it must come at %d bytes/s or more after the first %s, and all within %s", s.cfg.MinBodyRate, s.cfg.BodyGrace, s.readTimeout())
	default:
		return nil, api.Invalid("reading the body: %v", err)
	}
}

// bodyPacer reads a body, moving the connection's read deadline on as
// bytes arrive so that a sender must keep up the minimum rate. When the
// grace is over it takes one of the tunnel's places for slow bodies, or
// cuts the sender off at once if there is none.
type bodyPacer struct {
	body       io.Reader
	rc         *http.ResponseController
	slowBodies chan struct{}
	start, end time.Time // end: the read deadline never goes past it
	grace      time.Duration
	rate       float64 // bytes per second
	n          int64   // bytes read; only Read's goroutine touches it
	timer      *time.Timer

	mu   sync.Mutex // guards slow, cut and done: Read's goroutine and the timer's
	slow bool       // guarded by mu; holds a place in slowBodies
	cut  bool       // guarded by mu; found no place: the deadline is past for good
	done bool       // guarded by mu; the body was read to its end, or failed
}

func (p *bodyPacer) Read(b []byte) (int, error) {
	n, err := p.body.Read(b)
	if n > 0 {
		p.n += int64(n)
		p.mu.Lock()
		if !p.cut {
			p.rc.SetReadDeadline(p.deadline())
		}
		p.mu.Unlock()
	}
	return n, err
}

// deadline is when the bytes read so far stop being enough.
func (p *bodyPacer) deadline() time.Time {
	d := p.start.Add(p.grace + time.Duration(float64(p.n)/p.rate*float64(time.Second)))
	if d.After(p.end) {
		return p.end
	}
	return d
}

// graceOver runs when the grace ends with the body still arriving.
func (p *bodyPacer) graceOver() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	select {
	case p.slowBodies <- struct{}{}:
		p.slow = true
	default:
		p.cut = true
		p.rc.SetReadDeadline(time.Now()) // wakes the blocked Read with a timeout
	}
}

// finish gives back the slow place, if taken, and leaves a connection
// whose body was read whole the deadline of the whole request (the server
// watches it while the agent answers). It reports whether the sender was
// cut off for want of a place.
func (p *bodyPacer) finish(whole bool) bool {
	if p.timer == nil {
		return false
	}
	p.timer.Stop()
	p.mu.Lock()
	p.done = true
	slow, cut := p.slow, p.cut
	p.mu.Unlock()
	if slow {
		<-p.slowBodies
	}
	if whole {
		p.rc.SetReadDeadline(p.end)
	}
	return cut
}

// allow takes a token from the tunnel's rate limiter.
func (t *tunnel) allow(now time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.limiter.take(now)
}

// notifyRefused tells the agent the count of refused senders: at once if
// no notice went in the last noticeEvery, else once that interval is over,
// with the count as it is then. Never blocks.
func (t *tunnel) notifyRefused() {
	now := time.Now()
	t.mu.Lock()
	if t.noticeDue {
		t.mu.Unlock()
		return
	}
	wait := t.noticedAt.Add(t.noticeEvery).Sub(now)
	if wait <= 0 {
		t.noticedAt = now
		t.mu.Unlock()
		t.notify()
		return
	}
	t.noticeDue = true
	t.mu.Unlock()
	time.AfterFunc(wait, func() {
		t.mu.Lock()
		t.noticeDue = false
		t.noticedAt = time.Now()
		t.mu.Unlock()
		t.notify()
	})
}

// notify sends the counters to the agent, if one is connected; never blocks.
func (t *tunnel) notify() {
	t.mu.Lock()
	ac := t.agent
	n := wire.Notice{Rejected: t.rejected.Load(), Queued: t.queued}
	t.mu.Unlock()
	if ac != nil {
		ac.TrySend(frameconn.Frame{Head: wire.AppendNotice(nil, n)})
	}
}

// readAllPooled reads r (at most max bytes; more is errTooLarge) into a
// pooled buffer, the pool the agent's frames come from.
func readAllPooled(r io.Reader, max int64) (*bytes.Buffer, error) {
	buf := frameconn.GetBuf()
	n, err := buf.ReadFrom(io.LimitReader(r, max+1))
	if err != nil {
		frameconn.PutBuf(buf)
		return nil, err
	}
	if n > max {
		frameconn.PutBuf(buf)
		return nil, errTooLarge
	}
	return buf, nil
}

var errTooLarge = errors.New("relay: body too large")
