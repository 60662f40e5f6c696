package agent

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// CallReplayOptions selects what ReplayCall re-fires and how.
type CallReplayOptions struct {
	CallID      string  `json:"call_id"`      // "" replays every capture of the store (an export loaded for it)
	To          string  `json:"to"`           // another URL, used as is
	TimeScale   float64 `json:"time_scale"`   // times the original gaps; 0 sends back to back
	WithRetries bool    `json:"with_retries"` // the service's retries of a delivery too, not only the first
	// SetHeaders replace, on every request, the captured fields of the
	// same names: a secret an export masked, supplied again.
	SetHeaders wire.Header `json:"set_headers"`
}

// CallOriginals returns what ReplayCall would re-fire, oldest first: the
// call's captures, less the agent's own replays, unless WithRetries the
// service's retries of a delivery, and, unless To, those whose route sends
// nowhere (each event follows its route). A call with none is a NotFound.
func (a *Agent) CallOriginals(ctx context.Context, o CallReplayOptions) ([]*agentdb.Capture, error) {
	f := agentdb.CaptureFilter{}
	if o.CallID != "" {
		f.CallIDs = []string{o.CallID}
	}
	var out []*agentdb.Capture
	if _, err := a.store.EachCapture(ctx, f, func(c *agentdb.Capture) error {
		if c.ReplayOf == "" && (c.DuplicateOf == "" || o.WithRetries) && (o.To != "" || !a.sendsNowhere(c)) {
			out = append(out, c)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		if o.CallID != "" {
			return nil, api.Errorf(http.StatusNotFound, api.CodeNotFound, "no capture of call %s", o.CallID)
		}
		return nil, api.Errorf(http.StatusNotFound, api.CodeNotFound, "nothing to replay")
	}
	return out, nil
}

// ReplayCall re-fires originals (from CallOriginals) in their order, spaced
// as they first reached calltap times o.TimeScale, each stored as a replay
// of its original; each is called after every answer.
func (a *Agent) ReplayCall(ctx context.Context, originals []*agentdb.Capture, o CallReplayOptions, each func(orig, replay *agentdb.Capture)) error {
	for i, orig := range originals {
		if i > 0 && o.TimeScale > 0 {
			gap := time.Duration(float64(Arrival(orig).Sub(Arrival(originals[i-1]))) * o.TimeScale)
			select {
			case <-time.After(gap):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		ro := ReplayOptions{ID: orig.ID, To: o.To}
		if len(o.SetHeaders) > 0 {
			h := withHeaders(orig.RequestHeaders, o.SetHeaders)
			ro.Headers = &h
		}
		c, err := a.ReplayAndWait(ctx, ro)
		if err != nil {
			return fmt.Errorf("replaying %s: %w", orig.ID, err)
		}
		if each != nil {
			each(orig, c)
		}
	}
	return nil
}

// withHeaders is the header list stored (JSON) with each field of set in
// place of the first of its name, the others of that name dropped, and
// the fields of set it had none of at the end.
func withHeaders(stored string, set wire.Header) wire.Header {
	var h wire.Header
	_ = h.UnmarshalJSON([]byte(stored))
	out := make(wire.Header, 0, len(h)+len(set))
	placed := make([]bool, len(set))
	for _, f := range h {
		i := slices.IndexFunc(set, func(s wire.HeaderField) bool { return strings.EqualFold(s.Name, f.Name) })
		switch {
		case i < 0:
			out = append(out, f)
		case !placed[i]:
			// Every field of that name in set goes here, in order.
			for j, s := range set {
				if strings.EqualFold(s.Name, f.Name) {
					out = append(out, wire.HeaderField{Name: f.Name, Value: s.Value})
					placed[j] = true
				}
			}
		}
	}
	for i, s := range set {
		if !placed[i] {
			out = append(out, s)
		}
	}
	return out
}

// ReplayCallInBackground is ReplayCall on a goroutine of Run's, for the
// inspector's API: it returns once the replay is under way.
func (a *Agent) ReplayCallInBackground(ctx context.Context, o CallReplayOptions) (int, error) {
	originals, err := a.CallOriginals(ctx, o)
	if err != nil {
		return 0, err
	}
	err = a.goBackground(ctx, func(ctx context.Context) {
		if err := a.ReplayCall(ctx, originals, o, nil); err != nil && ctx.Err() == nil {
			a.log.Warn("replaying a call", "call", o.CallID, "err", err)
		}
	})
	return len(originals), err
}

// Arrival is when a capture first reached calltap: at the relay for one
// that waited in its queue.
func Arrival(c *agentdb.Capture) time.Time {
	if !c.ArrivedAt.IsZero() {
		return c.ArrivedAt
	}
	return c.CreatedAt
}
