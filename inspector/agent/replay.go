package agent

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/tunnelpath"
	"github.com/calltap/calltap/storage"
)

// ReplayOptions says what to re-send and how. Nil edits keep the original.
type ReplayOptions struct {
	ID        string        `json:"id"`
	To        string        `json:"to"`      // another URL, used as is
	Method    *string       `json:"method"`  // edited method
	Path      *string       `json:"path"`    // edited path and query
	Headers   *relay.Header `json:"headers"` // edited headers
	Body      *string       `json:"body"`    // edited body
	Retry     string        `json:"retry"`   // "" (once) or "service"
	TimeScale float64       `json:"time_scale"`
}

// Replay re-sends a capture as a new capture linked to it. Once: it waits
// for the answer. With the service's retry schedule: it returns at once
// (queued) and retries in the background, on a goroutine of Run's, until
// Run's context ends.
func (a *Agent) Replay(ctx context.Context, o ReplayOptions) (*storage.Capture, error) {
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
func (a *Agent) ReplayAndWait(ctx context.Context, o ReplayOptions) (*storage.Capture, error) {
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

// prepareReplay builds and saves the replay's capture.
func (a *Agent) prepareReplay(ctx context.Context, o ReplayOptions) (*storage.Capture, error) {
	orig, err := a.store.Capture(ctx, o.ID)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, api.NotFound("capture " + o.ID)
	} else if err != nil {
		return nil, err
	}
	if o.Retry != "" && o.Retry != "service" {
		return nil, api.Invalid(`retry must be "service" or empty`)
	}
	if o.TimeScale < 0 {
		return nil, api.Invalid("time_scale must be positive")
	}
	method, uri, body := orig.Method, orig.Path, orig.Body
	if orig.Query != "" {
		uri += "?" + orig.Query
	}
	var h relay.Header
	_ = h.UnmarshalJSON([]byte(orig.RequestHeaders))
	if o.Method != nil {
		if *o.Method == "" || !validToken(*o.Method) {
			return nil, api.Invalid("method %q is not an HTTP method", *o.Method)
		}
		method = *o.Method
	}
	if o.Path != nil {
		if len(*o.Path) == 0 || (*o.Path)[0] != '/' {
			return nil, api.Invalid("path must start with /")
		}
		if p, _, _ := strings.Cut(*o.Path, "?"); tunnelpath.Check(p) != nil {
			return nil, api.Invalid("the path %v", tunnelpath.Check(p))
		}
		uri = *o.Path
	}
	if o.Headers != nil {
		for _, f := range *o.Headers {
			if !validToken(f.Name) {
				return nil, api.Invalid("header name %q is not valid", f.Name)
			}
		}
		h = *o.Headers
	}
	if o.Body != nil {
		body = []byte(*o.Body)
	}
	if a.cfg.RewriteMedia {
		if out, _, err := RewriteMediaLinks(ctx, a.store, body, a.TunnelState().InspectorURL); err == nil {
			body = out
		}
	}
	c := a.newCapture(SourceReplay, method, uri, h, body)
	c.ReplayOf = orig.ID
	switch {
	case o.To != "":
		if _, err := ParseTarget(o.To); err != nil {
			return nil, api.Invalid("%v", err)
		}
		c.Target = o.To
	case c.Target == "" && orig.Target != "":
		// No local handler configured here (calltap replay from the
		// command line): send it where the original went.
		c.Target = orig.Target
		if o.Path != nil {
			if u, err := ParseTarget(orig.Target); err == nil {
				u.Path, u.RawQuery = "", ""
				c.Target = u.String() + uri
			}
		}
	}
	if c.Target == "" {
		return nil, api.Invalid("no target: give \"to\" or start the agent with --forward-to")
	}
	if o.Retry == "service" {
		c.MaxAttempts = len(callevent.RetrySchedule)
	}
	if err := a.save(ctx, writeOp{insert: c}); err != nil {
		return nil, err
	}
	return c, nil
}

// deliverWithSchedule tries c on the service's schedule, scaled, until an
// attempt succeeds or is not retryable, or the attempts run out.
func (a *Agent) deliverWithSchedule(ctx context.Context, c *storage.Capture, scale float64) {
	if scale <= 0 {
		scale = 1
	}
	for n, delay := range callevent.RetrySchedule {
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
		if c.Status != storage.StatusPending {
			return
		}
	}
}

// validToken reports whether s is an HTTP token (method or header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == ':' || c == '(' || c == ')' || c == '<' || c == '>' || c == '@' || c == ',' ||
			c == ';' || c == '\\' || c == '"' || c == '/' || c == '[' || c == ']' || c == '?' || c == '=' || c == '{' || c == '}' {
			return false
		}
	}
	return true
}
