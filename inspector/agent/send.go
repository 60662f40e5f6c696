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

	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
)

// Delivery to the local handler: one try of a capture's request at its
// target. Plain http targets go through handlerClient (handlerclient.go),
// https ones through net/http's client.

// sendResult is one try at the local handler.
type sendResult struct {
	status   int
	header   relay.Header
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
func (a *Agent) send(ctx context.Context, c *storage.Capture, h relay.Header, lim relay.Limits, sent func()) sendResult {
	start := time.Now()
	res := a.sendOnce(ctx, c, h, lim, sent)
	res.duration = time.Since(start)
	if res.err == "" {
		if err := lim.Check(&relay.Response{Status: res.status, Header: res.header, Body: res.body}); err != nil {
			res = sendResult{err: err.Error(), tooLarge: true, duration: res.duration}
		}
	}
	return res
}

func (a *Agent) sendOnce(ctx context.Context, c *storage.Capture, h relay.Header, lim relay.Limits, sent func()) sendResult {
	if c.Target == "" {
		if c.Error == errOutsideBase {
			return sendResult{err: c.Error}
		}
		return sendResult{err: "no local target: start the agent with --forward-to or replay with --to"}
	}
	req, err := http.NewRequestWithContext(ctx, c.Method, c.Target, bytes.NewReader(c.Body))
	if err != nil {
		return sendResult{err: err.Error()}
	}
	if h == nil {
		if err := h.UnmarshalJSON([]byte(c.RequestHeaders)); err != nil {
			return sendResult{err: "stored headers unreadable: " + err.Error()}
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
	maxBody, whose := a.cfg.MaxBody, "agent"
	if lim.MaxBody > 0 && lim.MaxBody < maxBody {
		maxBody, whose = lim.MaxBody, "relay"
	}
	if req.URL.Scheme == "http" {
		resp, err := a.handler.doLimited(ctx, req, maxBody, sent)
		if tl := (*bodyTooLargeError)(nil); errors.As(err, &tl) {
			return answerTooLarge(whose, maxBody)
		}
		if err != nil {
			return sendFailed("", err)
		}
		return sendResult{status: resp.status, header: relay.HeaderFrom(resp.header, ""), body: resp.body}
	}
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
	return sendResult{status: resp.StatusCode, header: relay.HeaderFrom(resp.Header, ""), body: body}
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
