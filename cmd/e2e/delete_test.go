package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/inspector/inspectortest"
)

// Deleting through the JSON API: a foreign Origin is refused in the
// envelope; a deleted capture is gone from the list, search, the calls
// view and exports, and its replay answers 404; a call goes whole. The
// keep mark is set and cleared.
func TestDeleteAndKeepThroughTheAPI(t *testing.T) {
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL + "/hooks"})
	send(t, st.TunnelURL+"/voice", event("call.started", "c-1", 1))
	send(t, st.TunnelURL+"/voice", event("call.ended", "c-1", 2))
	send(t, st.TunnelURL+"/voice", event("call.started", "c-2", 3))
	api := st.InspectorURL + "/api/v1/ext"
	list := func(query string) page {
		t.Helper()
		code, env := inspectortest.Do(t, "GET", api+"/webhooks/?limit=50"+query, "")
		var p page
		if code != 200 || json.Unmarshal(env.Data, &p) != nil {
			t.Fatalf("list: %d %s", code, env.Data)
		}
		return p
	}
	var id string
	for _, r := range list("&call_id=c-1").Results {
		if r.Event == "call.started" {
			id = r.ID
		}
	}

	if code, env := inspectortest.Do(t, "DELETE", api+"/webhooks/"+id+"/", "", "Origin", "https://evil.example"); code != 403 || env.Error == nil {
		t.Fatalf("a foreign origin: %d", code)
	}
	if code, env := inspectortest.Do(t, "PUT", api+"/webhooks/"+id+"/keep", `{"keep":true}`, "Content-Type", "application/json"); code != 200 || env.Error != nil {
		t.Fatalf("keep: %d %+v", code, env.Error)
	}
	if c, err := st.AgentDB.Capture(t.Context(), id); err != nil || !c.Keep {
		t.Fatalf("after keep: %v", err)
	}
	if code, _ := inspectortest.Do(t, "PUT", api+"/webhooks/"+id+"/keep", `{"keep":false}`, "Content-Type", "application/json"); code != 200 {
		t.Fatalf("unkeep: %d", code)
	}
	if code, env := inspectortest.Do(t, "PUT", api+"/webhooks/"+id+"/keep", `{}`, "Content-Type", "application/json"); code != 400 || env.Error == nil {
		t.Fatalf("keep without a value: %d", code)
	}

	if code, env := inspectortest.Do(t, "DELETE", api+"/webhooks/"+id+"/", ""); code != 200 || env.Error != nil {
		t.Fatalf("delete: %d %+v", code, env.Error)
	}
	if code, env := inspectortest.Do(t, "DELETE", api+"/webhooks/"+id+"/", ""); code != 404 || env.Error == nil {
		t.Fatalf("delete again: %d", code)
	}
	if code, _ := inspectortest.Do(t, "GET", api+"/webhooks/"+id+"/", ""); code != 404 {
		t.Fatalf("GET the deleted capture: %d", code)
	}
	if code, env := inspectortest.Do(t, "POST", api+"/webhooks/replay/", fmt.Sprintf(`{"id":%q}`, id), "Content-Type", "application/json"); code != 404 || env.Error == nil {
		t.Fatalf("replay of the deleted capture: %d", code)
	}
	for _, r := range list("").Results {
		if r.ID == id {
			t.Fatal("the deleted capture is still listed")
		}
	}
	if p := list("&q=call.started"); p.Count != 1 {
		t.Fatalf("search finds %d, want 1 (c-2's)", p.Count)
	}
	if code, env := inspectortest.Do(t, "GET", api+"/calls/c-1/", ""); code != 200 || strings.Contains(string(env.Data), id) {
		t.Fatalf("the calls view: %d, or it still shows the capture", code)
	}
	if body := getBody(t, api+"/export?call_id=c-1"); !strings.Contains(body, "call.ended") || strings.Contains(body, id) {
		t.Fatalf("the export after the delete:\n%s", body)
	}

	if code, env := inspectortest.Do(t, "DELETE", api+"/calls/c-1/", ""); code != 200 || env.Error != nil {
		t.Fatalf("delete the call: %d", code)
	}
	if code, _ := inspectortest.Do(t, "GET", api+"/calls/c-1/", ""); code != 404 {
		t.Fatalf("GET the deleted call: %d", code)
	}
	if code, env := inspectortest.Do(t, "DELETE", api+"/calls/nope/", ""); code != 404 || env.Error == nil {
		t.Fatalf("delete an unknown call: %d", code)
	}
	if p := list(""); p.Count != 1 || p.Results[0].CallID != "c-2" {
		t.Fatalf("left: %+v", p)
	}
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
