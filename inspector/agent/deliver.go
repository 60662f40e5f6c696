package agent

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/tunnelpath"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
	"github.com/google/uuid"
)

// newCapture builds a capture of a request, indexes it if it is a call
// event, and routes it (routing.go).
func (a *Agent) newCapture(source, method, uri string, h wire.Header, body []byte) *agentdb.Capture {
	path, query, _ := strings.Cut(uri, "?")
	hj, _ := h.MarshalJSON()
	c := &agentdb.Capture{
		ID:             newCaptureID(),
		Source:         source,
		CreatedAt:      time.Now().UTC(),
		Method:         method,
		Path:           path,
		Query:          query,
		RequestHeaders: string(hj),
		Body:           body,
		Status:         agentdb.StatusPending,
		MaxAttempts:    1,
		Duration:       -1,
	}
	IndexCapture(c)
	a.route(c, h)
	return c
}

// errOutsideBase is the error recorded for a request whose path could lead
// out of the --forward-to base path; it is not sent.
const errOutsideBase = "refused: the path could lead outside the --forward-to base path (a dot segment in some spelling, bytes that are not UTF-8, or a control character)"

// newCaptureID makes a capture's id: a UUIDv7, whose leading timestamp
// keeps the store's unique index on id appending instead of scattering.
func newCaptureID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}

// joinTarget appends the path the sender used after the tunnel prefix to
// the local handler's URL; "" when the path rule refuses the path
// (relay/tunnelpath): the handler, or a server before it, could resolve it
// to a place outside the base path.
func joinTarget(base *url.URL, path, query string) string {
	if tunnelpath.Check(path) != nil {
		return ""
	}
	u := *base
	if path != "" && path != "/" {
		// path is as the sender escaped it; keep it so (an encoded slash
		// stays encoded) instead of escaping it a second time.
		raw := strings.TrimSuffix(base.EscapedPath(), "/") + path
		if p, err := url.PathUnescape(raw); err == nil {
			u.Path, u.RawPath = p, raw
		} else {
			u.Path, u.RawPath = raw, ""
		}
	}
	u.RawQuery = query
	return u.String()
}

// deliver sends c to its target once (attempt n), records the outcome and
// returns it in the relay's terms.
func (a *Agent) deliver(ctx context.Context, c *agentdb.Capture, n int) *wire.Response {
	return a.record(c, n, a.send(ctx, c, nil, wire.Limits{}, nil))
}

// record writes attempt n's result res into c, adds it to the answers
// waiting to be committed (responses), prints its console line and
// returns the response for the relay.
func (a *Agent) record(c *agentdb.Capture, n int, res sendResult) *wire.Response {
	c.Attempts = n
	c.Duration = res.duration
	c.DeliveredAt = time.Now().UTC()
	c.ResponseStatus = res.status
	c.ResponseHeaders = ""
	c.ResponseBody = nil
	if res.header != nil {
		hj, _ := res.header.MarshalJSON()
		c.ResponseHeaders = string(hj)
		c.ResponseBody = res.body
	}
	c.Error = res.err
	if res.status >= 200 && res.status < 300 {
		c.Status = agentdb.StatusDelivered
	} else if n >= c.MaxAttempts || !retryable(res) {
		c.Status = agentdb.StatusFailed
	} else {
		c.Status = agentdb.StatusPending
	}
	c.LastAttempt = &agentdb.Attempt{N: n, At: c.DeliveredAt.Add(-res.duration), ResponseStatus: res.status, Error: res.err, Duration: res.duration}
	// The sender is waiting for the answer, not for our bookkeeping: the
	// update commits with the next commit (responses). A copy, since a
	// retry may change c before that.
	update := *c
	a.cm.addAnswer(&update)
	a.printLine(c)
	out := &wire.Response{Status: res.status, Header: res.header, Body: res.body, Error: res.err}
	switch {
	case res.timeout:
		out.Result = wire.ResultTimeout
	case res.tooLarge:
		out.Result = wire.ResultTooLarge
	case res.status == 0:
		out.Result = wire.ResultUnreachable
	}
	return out
}

// retryable is the voice service's rule (documentation 6.8).
func retryable(r sendResult) bool { return callevent.Retryable(r.status) }

// sendSaved sends a request whose save is under way (save first, in turn)
// and answers it once both are done. It waits for the save first when
// first is set or saves fail (a request not saved must not reach the
// handler), and sends none whose save failed already: its sender sends it
// again, and the handler need not see it now.
func (a *Agent) sendSaved(x *exchange, first bool) {
	if first || a.cm.savesFailing() {
		<-x.saved
	}
	select {
	case <-x.saved:
		if x.err != nil {
			x.finish(refusal(x.err))
			return
		}
	default:
	}
	if first {
		a.cm.savedAgain()
	}
	x.forwarded = true
	x.res = a.send(context.Background(), x.c, x.h, x.s.Limits(), nil)
	<-x.saved // comes: every queued write is told its outcome
	x.finish(a.response(x))
}

// response is a live request's answer once its send and its save are over:
// the handler's, recorded; or, not saved, a refusal naming why, and
// whether the handler may have the request (its sender sends it again, and
// that one is saved).
func (a *Agent) response(x *exchange) *wire.Response {
	switch {
	case x.err != nil && x.forwarded:
		return refusalAfterForward(x.err)
	case x.err != nil:
		return refusal(x.err)
	}
	return a.record(x.c, 1, x.res)
}
