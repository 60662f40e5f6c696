package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
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

// Set headers are placed in a capture that had fewer headers, or none.
func TestWithHeadersIntoFewer(t *testing.T) {
	set := wire.Header{{Name: "X-Secret", Value: "s"}, {Name: "X-Other", Value: "o"}}
	for stored, want := range map[string]wire.Header{
		`[]`:                   set,
		`[["A","1"]]`:          {{Name: "A", Value: "1"}, {Name: "X-Secret", Value: "s"}, {Name: "X-Other", Value: "o"}},
		`[["x-secret","old"]]`: {{Name: "x-secret", Value: "s"}, {Name: "X-Other", Value: "o"}},
	} {
		if got := withHeaders(stored, set); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("withHeaders(%s) = %v, want %v", stored, got, want)
		}
	}
}

// records is a slog.Handler passing the agent's records to the test; one
// that finds the channel full is dropped, never waited for.
type records chan slog.Record

func (c records) Enabled(context.Context, slog.Level) bool { return true }
func (c records) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c records) WithGroup(string) slog.Handler            { return c }
func (c records) Handle(_ context.Context, r slog.Record) error {
	select {
	case c <- r.Clone():
	default:
	}
	return nil
}

// A call replayed in the background (the inspector's) has no one waiting
// for its outcome: one that fails is logged with why, one that goes well
// is not.
func TestReplayCallInBackgroundLogsFailures(t *testing.T) {
	hs := httptest.NewServer(&seen{})
	t.Cleanup(hs.Close)
	d := openDisk(t)
	logged := make(records, 256)
	a, err := New(Config{Store: d.store, ForwardTo: hs.URL + "/base", Logger: slog.New(logged)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); a.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran })
	original(t, a, "/hook", `{"n":1}`, func(c *agentdb.Capture) { c.CallID = "call-ok" })
	original(t, a, "/hook", `{"n":2}`, func(c *agentdb.Capture) { c.CallID = "call-bad" })

	ctx := context.Background()
	if _, err := a.ReplayCallInBackground(ctx, CallReplayOptions{CallID: "call-ok"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ReplayCallInBackground(ctx, CallReplayOptions{CallID: "call-bad", To: "ftp://nowhere"}); err != nil {
		t.Fatal(err)
	}
	bound := time.After(polltest.MinWait)
	for {
		var r slog.Record
		select {
		case r = <-logged:
		case <-bound:
			t.Fatal("the failed background replay was not logged")
		}
		if r.Message != "replaying a call" {
			continue
		}
		var call, why string
		r.Attrs(func(at slog.Attr) bool {
			switch at.Key {
			case "call":
				call = at.Value.String()
			case "err":
				why = at.Value.String()
			}
			return true
		})
		if r.Level != slog.LevelWarn || call != "call-bad" || !strings.Contains(why, "ftp://nowhere") {
			t.Errorf("logged %s %q for call %q: %s; want a warning for call-bad saying why", r.Level, r.Message, call, why)
		}
		return
	}
}
