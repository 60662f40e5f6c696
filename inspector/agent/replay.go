package agent

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/agent/mediasave"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/tunnelpath"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// ReplayOptions says what to re-send and how. Nil edits keep the original.
type ReplayOptions struct {
	ID        string       `json:"id"`
	To        string       `json:"to"`      // another URL, used as is
	Method    *string      `json:"method"`  // edited method
	Path      *string      `json:"path"`    // edited path and query
	Headers   *wire.Header `json:"headers"` // edited headers
	Body      *string      `json:"body"`    // edited body
	Retry     string       `json:"retry"`   // "" (once) or "service"
	TimeScale float64      `json:"time_scale"`
}

// Replay re-sends a capture as a new capture linked to it. Once: it waits
// for the answer. With the service's retry schedule: it returns at once
// (queued) and retries in the background, on a goroutine of Run's, until
// Run's context ends.
func (a *Agent) Replay(ctx context.Context, o ReplayOptions) (*agentdb.Capture, error) {
	c, err := a.prepareReplay(ctx, o)
	if err != nil {
		return nil, err
	}
	if o.Retry == "service" {
		snapshot := *c // the schedule goes on changing c
		if err := a.goBackground(ctx, func(ctx context.Context) { a.deliverWithSchedule(ctx, c, o.TimeScale) }); err != nil {
			return nil, err
		}
		return &snapshot, nil
	}
	a.deliver(ctx, c, 1)
	return c, nil
}

// ReplayAndWait replays and waits for the last attempt, schedule included,
// and for its record to be written (the command line's replay).
func (a *Agent) ReplayAndWait(ctx context.Context, o ReplayOptions) (*agentdb.Capture, error) {
	c, err := a.prepareReplay(ctx, o)
	if err != nil {
		return nil, err
	}
	if o.Retry == "service" {
		a.deliverWithSchedule(ctx, c, o.TimeScale)
	} else {
		a.deliver(ctx, c, 1)
	}
	return c, a.Flush(ctx)
}

// prepareReplay builds and saves the replay's capture: the original's
// request with the options' edits, sent to the options' target or to where
// the original would go now.
func (a *Agent) prepareReplay(ctx context.Context, o ReplayOptions) (*agentdb.Capture, error) {
	orig, err := a.replayOriginal(ctx, o.ID)
	if err != nil {
		return nil, err
	}
	if err := checkReplayMode(o); err != nil {
		return nil, err
	}
	req, err := editRequest(orig, o)
	if err != nil {
		return nil, err
	}
	if a.cfg.RewriteMedia {
		if out, _, err := mediasave.RewriteLinks(ctx, a.store, req.body, a.TunnelState().InspectorURL); err == nil {
			req.body = out
		}
	}
	c := a.newCapture(SourceReplay, req.method, req.uri, req.header, req.body)
	c.ReplayOf = orig.ID
	a.followRoute(c, orig)
	if err := replayTarget(c, orig, o, req.uri); err != nil {
		return nil, err
	}
	if o.Retry == "service" {
		c.MaxAttempts = callevent.MaxAttempts
	}
	if err := a.cm.save(ctx, writeOp{insert: c}); err != nil {
		return nil, err
	}
	return c, nil
}

// replayOriginal reads the capture to replay; one that is not there is the
// caller's error (404), not the store's.
func (a *Agent) replayOriginal(ctx context.Context, id string) (*agentdb.Capture, error) {
	orig, err := a.store.Capture(ctx, id)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, api.NotFound("capture " + id)
	}
	return orig, err
}

// checkReplayMode checks how the replay is to be sent: once or on the
// service's schedule, at a non-negative time scale.
func checkReplayMode(o ReplayOptions) error {
	if o.Retry != "" && o.Retry != "service" {
		return api.Invalid(`retry must be "service" or empty`)
	}
	if o.TimeScale < 0 {
		return api.Invalid("time_scale must be positive")
	}
	return nil
}

// replayRequest is the request a replay sends.
type replayRequest struct {
	method string
	uri    string // path and query
	header wire.Header
	body   []byte
}

// editRequest returns orig's request with o's edits, each checked: a bad
// edit is the caller's error (400), and nothing is saved.
func editRequest(orig *agentdb.Capture, o ReplayOptions) (replayRequest, error) {
	r := replayRequest{method: orig.Method, uri: orig.Path, body: orig.Body}
	if orig.Query != "" {
		r.uri += "?" + orig.Query
	}
	_ = r.header.UnmarshalJSON([]byte(orig.RequestHeaders))
	if o.Method != nil {
		if !validToken(*o.Method) {
			return r, api.Invalid("method %q is not an HTTP method", *o.Method)
		}
		r.method = *o.Method
	}
	if o.Path != nil {
		if err := checkReplayPath(*o.Path); err != nil {
			return r, err
		}
		r.uri = *o.Path
	}
	if o.Headers != nil {
		if err := checkHeaderNames(*o.Headers); err != nil {
			return r, err
		}
		r.header = *o.Headers
	}
	if o.Body != nil {
		r.body = []byte(*o.Body)
	}
	return r, nil
}

// checkReplayPath checks an edited path and query: absolute, and a path the
// tunnel would carry.
func checkReplayPath(uri string) error {
	if len(uri) == 0 || uri[0] != '/' {
		return api.Invalid("path must start with /")
	}
	if p, _, _ := strings.Cut(uri, "?"); tunnelpath.Check(p) != nil {
		return api.Invalid("the path %v", tunnelpath.Check(p))
	}
	return nil
}

// checkHeaderNames checks that every edited header's name is an HTTP token.
func checkHeaderNames(h wire.Header) error {
	for _, f := range h {
		if !validToken(f.Name) {
			return api.Invalid("header name %q is not valid", f.Name)
		}
	}
	return nil
}

// replayTarget sets where c goes: o.To when given; else the local handler
// newCapture chose; else, with no handler configured here (calltap replay
// from the command line), where the original went, with an edited path.
func replayTarget(c, orig *agentdb.Capture, o ReplayOptions, uri string) error {
	switch {
	case o.To != "":
		if _, err := ParseTarget(o.To); err != nil {
			return api.Invalid("%v", err)
		}
		c.Target = o.To
	case c.Target == "" && orig.Target != "":
		c.Target = orig.Target
		if o.Path != nil {
			if u, err := ParseTarget(orig.Target); err == nil {
				u.Path, u.RawQuery = "", ""
				c.Target = u.String() + uri
			}
		}
	}
	switch {
	case c.Target != "":
	case orig.Route != "":
		return api.Invalid("capture %s took route %q, which sends nowhere now: give \"to\"", orig.ID, orig.Route)
	default:
		return api.Invalid("no target: give \"to\" or start the agent with --forward-to")
	}
	return nil
}

// deliverWithSchedule tries c on the service's schedule, scaled, until an
// attempt succeeds or is not retryable, or the attempts run out.
func (a *Agent) deliverWithSchedule(ctx context.Context, c *agentdb.Capture, scale float64) {
	if scale <= 0 {
		scale = 1
	}
	for n, delay := range callevent.RetrySchedule() {
		if n > 0 {
			t := time.NewTimer(time.Duration(float64(delay) * scale))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		a.deliver(ctx, c, n+1)
		if c.Status != agentdb.StatusPending {
			return
		}
	}
}

// tokenSeparators are the characters besides controls, space and non-ASCII
// that an HTTP token may not hold (RFC 9110, section 5.6.2).
const tokenSeparators = `()<>@,;:\"/[]?={}`

// validToken reports whether s is an HTTP token (method or header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(tokenSeparators, c) >= 0 {
			return false
		}
	}
	return true
}
