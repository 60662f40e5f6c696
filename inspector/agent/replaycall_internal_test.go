package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/agentdb"
)

// A call's replay waits the gaps the originals first came with times the
// scale, a scale above 1 lengthening them.
func TestReplayCallLengthensTheGaps(t *testing.T) {
	a := runAgent(t, &seen{})
	t0 := time.Now().UTC().Add(-time.Minute)
	first := original(t, a, "/hook", `{"n":1}`, func(c *agentdb.Capture) { c.CallID, c.CreatedAt = "call-1", t0 })
	second := original(t, a, "/hook", `{"n":2}`, func(c *agentdb.Capture) { c.CallID, c.CreatedAt = "call-1", t0.Add(50*time.Millisecond) })
	start := time.Now()
	if err := a.ReplayCall(context.Background(), []*agentdb.Capture{first, second}, CallReplayOptions{CallID: "call-1", TimeScale: 2}, nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("the replay took %s: the 50 ms gap times 2 was not kept", took)
	}
}

// A call with nothing to replay is named in the error; a store with
// nothing at all says so.
func TestCallOriginalsNotFound(t *testing.T) {
	a := runAgent(t, &seen{})
	ctx := context.Background()
	if _, err := a.CallOriginals(ctx, CallReplayOptions{}); err == nil || !strings.HasSuffix(err.Error(), "nothing to replay") {
		t.Errorf("an empty store: %v, want nothing to replay", err)
	}
	if _, err := a.CallOriginals(ctx, CallReplayOptions{CallID: "call-9"}); err == nil || !strings.Contains(err.Error(), "no capture of call call-9") {
		t.Errorf("an unknown call: %v, want it named", err)
	}
}
