package agent

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
)

// CallReplayOptions selects what ReplayCall re-fires and how.
type CallReplayOptions struct {
	CallID      string  `json:"call_id"`      // "" replays every capture of the store (an export loaded for it)
	To          string  `json:"to"`           // another URL, used as is
	TimeScale   float64 `json:"time_scale"`   // times the original gaps; 0 sends back to back
	WithRetries bool    `json:"with_retries"` // the service's retries of a delivery too, not only the first
}

// CallOriginals returns what ReplayCall would re-fire, oldest first: the
// call's captures, less the agent's own replays and, unless WithRetries,
// the service's retries of a delivery. A call with none is a NotFound.
func (a *Agent) CallOriginals(ctx context.Context, o CallReplayOptions) ([]*storage.Capture, error) {
	f := storage.CaptureFilter{}
	if o.CallID != "" {
		f.CallIDs = []string{o.CallID}
	}
	var out []*storage.Capture
	if _, err := a.store.EachCapture(ctx, f, func(c *storage.Capture) error {
		if c.ReplayOf == "" && (c.DuplicateOf == "" || o.WithRetries) {
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
func (a *Agent) ReplayCall(ctx context.Context, originals []*storage.Capture, o CallReplayOptions, each func(orig, replay *storage.Capture)) error {
	for i, orig := range originals {
		if i > 0 && o.TimeScale > 0 {
			gap := time.Duration(float64(Arrival(orig).Sub(Arrival(originals[i-1]))) * o.TimeScale)
			select {
			case <-time.After(gap):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		c, err := a.ReplayAndWait(ctx, ReplayOptions{ID: orig.ID, To: o.To})
		if err != nil {
			return fmt.Errorf("replaying %s: %w", orig.ID, err)
		}
		if each != nil {
			each(orig, c)
		}
	}
	return nil
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
func Arrival(c *storage.Capture) time.Time {
	if !c.ArrivedAt.IsZero() {
		return c.ArrivedAt
	}
	return c.CreatedAt
}
