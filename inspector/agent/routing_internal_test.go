package agent

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/calltap/calltap/inspector/routes"
	"github.com/calltap/calltap/storage/agentdb"
)

// A replay follows the route its original took, as the file says now: a
// changed forward-to is followed, a whole call's events each take theirs;
// a capture stored only is sent nowhere unless "to" says where.
func TestReplayFollowsTheRoute(t *testing.T) {
	media, other, moved := &seen{}, &seen{}, &seen{}
	urls := map[*seen]string{}
	for _, h := range []*seen{media, other, moved} {
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		urls[h] = hs.URL
	}
	file := func(mediaURL string) *routes.Table {
		t.Helper()
		tb, err := routes.Parse("routes.toml", fmt.Appendf(nil, `
[[route]]
name = "quiet"
events = ["call.connected"]
store-only = true

[[route]]
name = "media"
events = ["call.recording_available"]
forward-to = %q
`, mediaURL))
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	a := runAgent(t, other)
	a.SetRoutes(file(urls[media]))
	ev := func(kind string) string {
		return fmt.Sprintf(`{"id":"d-%s","event":%q,"call":{"call_id":"c1"}}`, kind, kind)
	}
	rec := original(t, a, "/hook", ev("call.recording_available"), nil)
	quiet := original(t, a, "/hook", ev("call.connected"), nil)
	ended := original(t, a, "/hook", ev("call.ended"), nil)
	if rec.Route != "media" || quiet.Route != "quiet" || quiet.Status != agentdb.StatusStored || ended.Route != routes.DefaultName {
		t.Fatalf("routes taken: %s %s (%s) %s", rec.Route, quiet.Route, quiet.Status, ended.Route)
	}

	ctx := context.Background()
	a.SetRoutes(file(urls[moved])) // the media route's handler moved
	for _, id := range []string{rec.ID, ended.ID} {
		if _, err := a.ReplayAndWait(ctx, ReplayOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.ReplayAndWait(ctx, ReplayOptions{ID: quiet.ID}); err == nil || !strings.Contains(err.Error(), `route "quiet"`) {
		t.Errorf("a replay of a capture stored only, with no \"to\": %v", err)
	}
	c, err := a.ReplayAndWait(ctx, ReplayOptions{ID: quiet.ID, To: urls[media]})
	if err != nil || c.Status != agentdb.StatusDelivered {
		t.Fatalf("a replay of a capture stored only, to a URL: %v, %+v", err, c)
	}
	// A whole call: each event along its route, the one stored only left.
	originals, err := a.CallOriginals(ctx, CallReplayOptions{CallID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ReplayCall(ctx, originals, CallReplayOptions{CallID: "c1"}, nil); err != nil {
		t.Fatal(err)
	}
	for h, want := range map[*seen]int{moved: 2, other: 2, media: 1} {
		if got := h.all(); len(got) != want {
			t.Errorf("handler %s got %d requests, want %d: %v", urls[h], len(got), want, got)
		}
	}
	if got := moved.all(); !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "recording_available") }) {
		t.Errorf("the replay of the media event did not follow its route to where it moved: %v", got)
	}
}
