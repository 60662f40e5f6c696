package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/routes"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/scripts/chaos/history"
)

// TestRouteFile: the route file a run writes is one calltap reads, and it
// sends the senders' calls where the checker will expect them: recordings
// and analyses to media, the rest of alice's call, though only its
// call.started names her, to alice, and bob's call and a call of nobody's
// to the default. Only call.started names a developer.
func TestRouteFile(t *testing.T) {
	rs := chaosRoutes("alice")
	urls := map[string]string{}
	for _, sv := range handlerServers(rs, nil) {
		urls[sv.route] = "http://127.0.0.1:9/" + sv.route
	}
	if history.DefaultRoute != routes.DefaultName {
		t.Fatalf("the history's default route %q is not calltap's %q", history.DefaultRoute, routes.DefaultName)
	}
	file := filepath.Join(t.TempDir(), routesFile)
	if err := writeRoutes(file, rs, urls); err != nil {
		t.Fatal(err)
	}
	table, err := routes.Load(file, routes.WithCallValues(routes.NewMemory()))
	if err != nil {
		b, _ := os.ReadFile(file)
		t.Fatalf("%v\n%s", err, b)
	}
	want := map[string]map[string]string{ // developer -> event kind -> route
		"alice": {"call.started": "alice", "call.connected": "alice", "call.ended": "alice",
			"call.recording_available": "media", "call.analysis_completed": "media"},
		"bob": {"call.started": "default", "call.connected": "default", "call.ended": "default",
			"call.recording_available": "media", "call.analysis_completed": "media"},
		"": {"call.started": "default", "call.connected": "default", "call.ended": "default",
			"call.recording_available": "media", "call.analysis_completed": "media"},
	}
	for dev, kinds := range want {
		events := callEvents(callevent.CallSpec{Start: time.Now()}, dev)
		if len(events) != len(kinds) {
			t.Fatalf("%d events, want %d", len(events), len(kinds))
		}
		for i, p := range events {
			body, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if named, _ := p.Call.Variables["developer"].(string); (i == 0 && named != dev) || (i > 0 && named != "") {
				t.Errorf("developer %q: %s names developer %q", dev, p.Event, named)
			}
			d := table.Match(routes.Request{Body: body, Path: "/hook"})
			if got := d.Name(); got != kinds[p.Event] {
				t.Errorf("developer %q: %s went to %s, want %s", dev, p.Event, got, kinds[p.Event])
			}
			if d.Route != nil && d.Route.ForwardTo.String() != urls[d.Name()] {
				t.Errorf("route %s forwards to %s, want %s", d.Name(), d.Route.ForwardTo, urls[d.Name()])
			}
		}
	}
}
