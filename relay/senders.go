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
	"github.com/google/uuid"
)

// HasDotSegment reports whether an escaped URL path has a "." or ".."
// segment in any spelling that a server on the way to the handler might
// decode into one: percent-encoded (once or more), split at an encoded
// slash or at a backslash, or with a ";" parameter after it. Such a path
// could climb out of the base path the agent forwards to.
func HasDotSegment(path string) bool {
	if !strings.ContainsAny(path, ".%") {
		return false // neither a dot nor an escape that could make one
	}
	for {
		if plainDotSegment(path) {
			return true
		}
		dec := unescapeLenient(path)
		if dec == path {
			return false
		}
		path = dec
	}
}

func plainDotSegment(path string) bool {
	for _, seg := range strings.FieldsFunc(path, func(r rune) bool { return r == '/' || r == '\\' }) {
		seg, _, _ = strings.Cut(seg, ";")
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// unescapeLenient decodes every valid %XX and keeps anything else as it
// is, so that one bad escape does not hide the others.
func unescapeLenient(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if hi, lo := unhex(s[i+1]), unhex(s[i+2]); hi >= 0 && lo >= 0 {
				b.WriteByte(byte(hi<<4 | lo))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

func (s *Server) serveTunnel(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), "/t/")
	id, uri, _ := strings.Cut(rest, "/")
	uri = "/" + uri
	dotted := HasDotSegment(uri)
	if r.URL.RawQuery != "" {
		uri += "?" + r.URL.RawQuery
	}
	t, err := s.lookupTunnel(r.Context(), id)
	if err != nil {
		// The service retries a 5xx: what cannot be looked up now is not lost.
		s.log.Error("tunnel lookup", "tunnel", id, "err", err)
		w.Header().Set("Retry-After", "5")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "the relay could not read its tokens; retry later"))
		return
	}
	if t == nil {
		s.fail(w, api.NotFound("tunnel"))
		return
	}
	// A logger per request, made only when something is logged: slog's
	// With formats its attributes at once, which a hot path cannot afford.
	log := reqLogger{s.log, t.id, ""}

	// Refused senders spend the tunnel's allowance too: refusing is work,
	// and a flood must be cut off by the rate limit whatever it carries.
	if wait, ok := t.allow(time.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		s.fail(w, api.Errorf(http.StatusTooManyRequests, api.CodeRateLimited, "too many requests for this tunnel"))
		return
	}
	for _, f := range s.requiredHeaders(t) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(f.Name)), []byte(f.Value)) != 1 {
			t.rejected.Add(1)
			t.notifyRefused()
			log.Info("sender refused: required header missing or wrong", "header", f.Name)
			s.fail(w, api.Errorf(http.StatusUnauthorized, api.CodeHeaderRejected, "the %s header is missing or wrong", f.Name))
			return
		}
	}
	if dotted {
		// The path is appended to the base path of the agent's local
		// handler: a "." or ".." segment could lead out of it.
		log.Info("sender refused: dot segment in the path", "uri", uri)
		s.fail(w, api.Invalid("the path after the tunnel id must not have a dot segment (. or ..), in any encoding"))
		return
	}
	if r.ContentLength > s.cfg.MaxBody {
		s.fail(w, api.Errorf(http.StatusRequestEntityTooLarge, api.CodeTooLarge, "body larger than %d bytes", s.cfg.MaxBody))
		return
	}
	buf, bodyErr := s.readBody(w, r, t)
	if bodyErr != nil {
		if bodyErr.Status == http.StatusRequestTimeout {
			w.Header().Set("Connection", "close")
			log.Info("slow sender cut off", "reason", bodyErr.Message)
		}
		s.fail(w, bodyErr)
		return
	}
	select {
	case t.inflight <- struct{}{}:
		defer func() { <-t.inflight }()
	default:
		putBuf(buf)
		w.Header().Set("Retry-After", "1")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeUnavailable, "too many requests in flight for this tunnel"))
		return
	}
	s.metrics.bytesIn.Add(int64(buf.Len()))
	req := &Request{
		ID:        uuid.NewString(),
		ArrivedAt: time.Now().UnixMicro(),
		Method:    r.Method,
		URI:       uri,
		Header:    HeaderFrom(r.Header, r.Host),
		Body:      buf.Bytes(),
	}
	log.request = req.ID
	if node := s.remoteHolder(t); node != "" && !t.held() {
		defer putBuf(buf)
		s.forwardToNode(w, r, t, node, req, log)
		return
	}
	s.deliver(w, r.Context(), t, req, buf, log)
}

// deliver hands req to the agent connected here, or queues it while none
// is, or while the queue still drains (a live request must not overtake
// queued ones). ctx is the sender's.
func (s *Server) deliver(w http.ResponseWriter, ctx context.Context, t *tunnel, req *Request, buf *bytes.Buffer, log reqLogger) {
	t.mu.Lock()
	ac := t.agent
	live := ac != nil && t.queued == 0
	t.mu.Unlock()
	if live {
		// The pooled buffer backs req.Body until the frame is written; the
		// round trip returns only after that.
		s.forward(w, ctx, ac, req, buf, log)
		return
	}
	defer putBuf(buf)
	s.enqueue(w, ctx, t, req, log)
}

// held reports whether an agent holds t on this node.
func (t *tunnel) held() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.agent != nil
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

	mu   sync.Mutex
	slow bool // holds a place in slowBodies
	cut  bool // found no place: the deadline is past for good
	done bool
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
	n := Notice{Rejected: t.rejected.Load(), Queued: t.queued}
	t.mu.Unlock()
	if ac != nil {
		ac.trySend(outFrame{head: appendJSON(nil, frameNotice, n)})
	}
}

// tokenBucket is a plain token bucket; the caller holds the lock.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func (b *tokenBucket) take(now time.Time) (time.Duration, bool) {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second)), false
}
