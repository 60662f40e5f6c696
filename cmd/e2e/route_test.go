package e2e_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/inspector/routes"
	"github.com/calltap/calltap/storage/agentdb"
)

type routeSummary struct {
	ID     string  `json:"id"`
	Event  string  `json:"event"`
	Route  *string `json:"route"` // a pointer: the field must be there, "" included
	Status string  `json:"status"`
}

// Every capture of a listing and a detail carries its route ("" when no
// route file decided); route=NAME filters the list, its count and its
// export; a store-only capture reads status stored, with no response.
func TestRoutesInTheAPI(t *testing.T) {
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL + "/hooks"})
	// A capture before the route file, then one taken by each route.
	send(t, st.TunnelURL+"/voice", event("call.ended", "c-route", 1))
	table, err := routes.Parse("routes.toml", []byte(`
[[route]]
name = "alice"
events = ["call.started"]
forward-to = "`+hs.URL+`/alice"

[[route]]
name = "quiet"
events = ["call.connected"]
store-only = true
`))
	if err != nil {
		t.Fatal(err)
	}
	st.Agent.SetRoutes(table)
	send(t, st.TunnelURL+"/voice", event("call.started", "c-route", 2))
	send(t, st.TunnelURL+"/voice", event("call.connected", "c-route", 3))
	api := st.InspectorURL + "/api/v1/ext"
	list := func(query string) (int, []routeSummary) {
		t.Helper()
		code, env := inspectortest.Do(t, "GET", api+"/webhooks/?limit=50"+query, "")
		var p struct {
			Count   int            `json:"count"`
			Results []routeSummary `json:"results"`
		}
		if code != 200 || json.Unmarshal(env.Data, &p) != nil {
			t.Fatalf("list %s: %d %s", query, code, env.Data)
		}
		return p.Count, p.Results
	}
	_, all := list("")
	if len(all) != 3 {
		t.Fatalf("%d captures listed, want 3", len(all))
	}
	if _, path := h.last(); h.count() != 2 || path != "/alice/voice" {
		t.Errorf("the handler got %d requests, the last at %s; want 2, the last at alice's /alice/voice (quiet's at none)", h.count(), path)
	}
	byEvent := map[string]string{}
	for _, s := range all {
		byEvent[s.Event] = s.ID
	}
	alice, quiet, none := byEvent["call.started"], byEvent["call.connected"], byEvent["call.ended"]
	want := map[string]string{alice: "alice", quiet: "quiet", none: ""}
	for _, s := range all {
		if s.Route == nil || *s.Route != want[s.ID] {
			t.Errorf("capture %s lists route %v, want %q (and the field present)", s.ID, s.Route, want[s.ID])
		}
	}
	for route, id := range map[string]string{"alice": alice, "quiet": quiet} {
		count, got := list("&route=" + route)
		if count != 1 || len(got) != 1 || got[0].ID != id {
			t.Errorf("route=%s: count %d, %+v; want %s alone", route, count, got, id)
		}
	}
	if count, got := list("&route=nobody"); count != 0 || len(got) != 0 {
		t.Errorf("route=nobody: count %d, %+v; want none", count, got)
	}
	if count, _ := list("&route=quiet&event=call.started"); count != 0 {
		t.Errorf("route and event together: count %d, want 0: the filters add up", count)
	}

	code, env := inspectortest.Do(t, "GET", api+"/webhooks/"+quiet+"/", "")
	var d struct {
		routeSummary
		ResponseStatus *int `json:"response_status"`
	}
	if code != 200 || json.Unmarshal(env.Data, &d) != nil || d.Route == nil || *d.Route != "quiet" || d.Status != agentdb.StatusStored || d.ResponseStatus != nil {
		t.Errorf("detail of the stored capture: %d %s; want route quiet, status stored, no response", code, env.Data)
	}

	res, err := http.Get(api + "/export?route=alice")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if lines := strings.Split(strings.TrimSpace(string(body)), "\n"); res.StatusCode != 200 || len(lines) != 2 || !strings.Contains(lines[1], alice) {
		t.Errorf("export?route=alice: %d\n%s", res.StatusCode, body)
	}
}
