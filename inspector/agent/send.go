package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// Delivery to the local handler: one try of a capture's request at its
// target. Plain http targets go through handlerClient (handlerclient.go),
// https ones through net/http's client.

// sendResult is one try at the local handler.
type sendResult struct {
	status   int
	header   wire.Header
	body     []byte
	err      string
	timeout  bool
	tooLarge bool // the handler answered, but more than can be passed on
	duration time.Duration
}

// send tries c's request at its target once. h is the request's headers
// when at hand (a live request), sparing a parse of the stored JSON; nil
// parses it. lim is what the relay takes in answer to a live request: an
// answer over it is not read past the limit and fails as too large. sent,
// if not nil, is called when the request is written to an http target,
// before its answer is read (handlerClient.doLimited: again for each new
// connection tried); a try that fails before that, or an https target,
// never calls it.
func (a *Agent) send(ctx context.Context, c *agentdb.Capture, h wire.Header, lim wire.Limits, sent func()) sendResult {
	start := time.Now()
	res := a.sendOnce(ctx, c, h, lim, sent)
	res.duration = time.Since(start)
	if res.err == "" {
		if err := lim.Check(&wire.Response{Status: res.status, Header: res.header, Body: res.body}); err != nil {
			res = sendResult{err: err.Error(), tooLarge: true, duration: res.duration}
		}
	}
	return res
}

// sendOnce is send's try, without the timing and the relay's final check.
func (a *Agent) sendOnce(ctx context.Context, c *agentdb.Capture, h wire.Header, lim wire.Limits, sent func()) sendResult {
	if c.Target == "" {
		return noTarget(c)
	}
	req, res := newHandlerRequest(ctx, c, h)
	if req == nil {
		return res
	}
	maxBody, whose := a.cfg.MaxBody, "agent"
	if lim.MaxBody > 0 && lim.MaxBody < maxBody {
		maxBody, whose = lim.MaxBody, "relay"
	}
	if req.URL.Scheme == "http" {
		return a.sendHTTP(ctx, req, maxBody, whose, sent)
	}
	return a.sendHTTPS(req, maxBody, whose)
}

// noTarget is the result of a capture that has nowhere to go: its path
// leads outside the handler's base, or no handler is configured.
func noTarget(c *agentdb.Capture) sendResult {
	if c.Error == errOutsideBase {
		return sendResult{err: c.Error}
	}
	return sendResult{err: "no local target: start the agent with --forward-to or replay with --to"}
}

// newHandlerRequest builds c's request to its target, with h (nil: c's
// stored headers) less the hop-by-hop ones; Host goes as
// X-Forwarded-Host, since the target has its own. On failure the request
// is nil and the result says why.
func newHandlerRequest(ctx context.Context, c *agentdb.Capture, h wire.Header) (*http.Request, sendResult) {
	req, err := http.NewRequestWithContext(ctx, c.Method, c.Target, bytes.NewReader(c.Body))
	if err != nil {
		return nil, sendResult{err: err.Error()}
	}
	if h == nil {
		if err := h.UnmarshalJSON([]byte(c.RequestHeaders)); err != nil {
			return nil, sendResult{err: "stored headers unreadable: " + err.Error()}
		}
	}
	for _, f := range h {
		if http.CanonicalHeaderKey(f.Name) == "Host" {
			req.Header.Add("X-Forwarded-Host", f.Value)
			continue
		}
		if api.ConnectionHeader(f.Name) {
			continue
		}
		req.Header.Add(f.Name, f.Value)
	}
	req.ContentLength = int64(len(c.Body))
	return req, sendResult{}
}

// sendHTTP tries req at a plain http target through handlerClient, reading
// at most maxBody of the answer (the limit of whose).
func (a *Agent) sendHTTP(ctx context.Context, req *http.Request, maxBody int64, whose string, sent func()) sendResult {
	resp, err := a.handler.doLimited(ctx, req, maxBody, sent)
	if tl := (*bodyTooLargeError)(nil); errors.As(err, &tl) {
		return answerTooLarge(whose, maxBody)
	}
	if err != nil {
		return sendFailed("", err)
	}
	return sendResult{status: resp.status, header: wire.HeaderFrom(resp.header, ""), body: resp.body}
}

// sendHTTPS tries req at an https target through net/http's client,
// reading at most maxBody of the answer (the limit of whose).
func (a *Agent) sendHTTPS(req *http.Request, maxBody int64, whose string) sendResult {
	resp, err := a.client.Do(req)
	if err != nil {
		return sendFailed("", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return sendFailed("reading the response: ", err)
	}
	if int64(len(body)) > maxBody {
		return answerTooLarge(whose, maxBody)
	}
	return sendResult{status: resp.StatusCode, header: wire.HeaderFrom(resp.Header, ""), body: body}
}

// answerTooLarge is the result of a try whose answer's body is over the
// limit of whose ("agent" or "relay").
func answerTooLarge(whose string, limit int64) sendResult {
	return sendResult{err: fmt.Sprintf("the handler's answer is larger than the %s's limit of %d bytes", whose, limit), tooLarge: true}
}

// sendFailed is the result of a try that got no answer; the client's
// *url.Error tells whether it timed out. The error starts with what
// failed, in words, before the client's own text.
func sendFailed(prefix string, err error) sendResult {
	var ue *url.Error
	timeout := errors.As(err, &ue) && ue.Timeout()
	msg := prefix + err.Error()
	if cause := failureCause(err, timeout); cause != "" {
		msg = cause + ": " + msg
	}
	return sendResult{err: msg, timeout: timeout}
}
