package agent

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
)

// A replay made once (the inspector's replay) returns with the handler's
// answer; one on the service's schedule returns at once, queued, and is
// delivered in the background.
func TestReplayOnceAndOnTheSchedule(t *testing.T) {
	h := &seen{}
	a := runAgent(t, h)
	orig := original(t, a, "/hook", `{"n":1}`, nil)
	ctx := context.Background()

	c, err := a.Replay(ctx, ReplayOptions{ID: orig.ID})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != agentdb.StatusDelivered || c.ResponseStatus != http.StatusAccepted || c.Attempts != 1 || len(h.all()) != 1 {
		t.Errorf("once: returned %s, answered %d, %d attempts; the handler had %d requests; want delivered, 202, 1, 1",
			c.Status, c.ResponseStatus, c.Attempts, len(h.all()))
	}

	q, err := a.Replay(ctx, ReplayOptions{ID: orig.ID, Retry: "service"})
	if err != nil {
		t.Fatal(err)
	}
	if q.Status != agentdb.StatusPending || q.Attempts != 0 || q.ReplayOf != orig.ID {
		t.Errorf("on the schedule: returned %s after %d attempts, a replay of %q; want it queued, not yet tried", q.Status, q.Attempts, q.ReplayOf)
	}
	polltest.Until(t, 10*time.Second, func() bool { return len(h.all()) == 2 }, "the queued replay to reach the handler")
}

// The command line's replay on the service's schedule tries a failing
// handler as often as the service would, and a replay once tries it once.
func TestReplayAndWaitOnTheSchedule(t *testing.T) {
	var tries atomic.Int32
	a := runAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tries.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	orig := original(t, a, "/hook", `{"n":1}`, nil)
	ctx := context.Background()

	// The scaled schedule takes a quarter of a second; the bound stops one
	// run at the wrong scale (30 s / 0.0001 before the second try).
	bound, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := a.ReplayAndWait(bound, ReplayOptions{ID: orig.ID, Retry: "service", TimeScale: 0.0001})
	if err != nil {
		t.Fatal(err)
	}
	if c.Attempts != callevent.MaxAttempts || c.Status != agentdb.StatusFailed || tries.Load() != callevent.MaxAttempts {
		t.Fatalf("on the schedule: %s after %d attempts, %d tries reached the handler; want failed after %d", c.Status, c.Attempts, tries.Load(), callevent.MaxAttempts)
	}
	c, err = a.ReplayAndWait(ctx, ReplayOptions{ID: orig.ID})
	if err != nil {
		t.Fatal(err)
	}
	if c.Attempts != 1 || c.Status != agentdb.StatusFailed || tries.Load() != callevent.MaxAttempts+1 {
		t.Errorf("once: %s after %d attempts, %d tries in all; want failed after 1", c.Status, c.Attempts, tries.Load())
	}
}

// A replay's method or header name holding any of the separators RFC 9110
// keeps out of tokens is refused, the first of them as surely as the rest.
func TestValidTokenRefusesEverySeparator(t *testing.T) {
	for _, sep := range []byte(`()<>@,;:\"/[]?={}`) {
		if name := "X" + string(sep) + "Y"; validToken(name) {
			t.Errorf("%q taken for a token", name)
		}
	}
}
