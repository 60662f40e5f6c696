package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// The API's replay, keep and delete take the ids a person has at hand, as
// the CLI does: a delivery id (replay takes the original of a delivery
// sent twice; keep and delete every capture of it) or a unique prefix of
// a capture id; an ambiguous prefix is a 409 listing the choices.
func TestAPITakesAnyID(t *testing.T) {
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL + "/hooks"})
	twice := event("call.started", "c-1", 1)
	send(t, st.TunnelURL+"/voice", twice)
	send(t, st.TunnelURL+"/voice", twice) // the service's retry: a duplicate
	delivery := "00000000-0000-4000-8000-000000000001"
	api := st.InspectorURL + "/api/v1/ext"
	cs, _, err := st.AgentDB.Captures(t.Context(), agentdb.CaptureFilter{DeliveryID: delivery, Page: storage.Page{Limit: 10}})
	if err != nil || len(cs) != 2 {
		t.Fatalf("captures of the delivery: %d %v", len(cs), err)
	}
	orig, dup := cs[1], cs[0] // newest first
	if dup.DuplicateOf != orig.ID {
		t.Fatalf("the second copy is not a duplicate of the first: %+v", dup)
	}

	code, env := inspectortest.Do(t, "POST", api+"/webhooks/replay/", fmt.Sprintf(`{"id":%q}`, delivery), "Content-Type", "application/json")
	if code != 200 {
		t.Fatalf("replay by delivery id: %d %+v", code, env.Error)
	}
	var replayed struct {
		ID string `json:"id"`
	}
	json.Unmarshal(env.Data, &replayed)
	if c, err := st.AgentDB.Capture(t.Context(), replayed.ID); err != nil || c.ReplayOf != orig.ID {
		t.Errorf("replay by delivery id: %v; want a replay of the original %s (%s)", err, orig.ID, env.Data)
	}
	if code, env := inspectortest.Do(t, "PUT", api+"/webhooks/"+dup.ID[:20]+"/keep", `{"keep":true}`, "Content-Type", "application/json"); code != 200 {
		t.Fatalf("keep by prefix: %d %+v", code, env.Error)
	}
	if c, err := st.AgentDB.Capture(t.Context(), dup.ID); err != nil || !c.Keep {
		t.Fatalf("keep by prefix did not keep %s: %v", dup.ID, err)
	}
	code, env = inspectortest.Do(t, "DELETE", api+"/webhooks/"+orig.ID[:4]+"/", "")
	if code != 409 || env.Error == nil || env.Error.Code != "ambiguous_id" || !strings.Contains(env.Error.Message, orig.ID) || !strings.Contains(env.Error.Message, dup.ID) {
		t.Fatalf("an ambiguous prefix: %d %+v, want 409 listing both", code, env.Error)
	}
	if code, env := inspectortest.Do(t, "DELETE", api+"/webhooks/"+delivery+"/", ""); code != 200 {
		t.Fatalf("delete by delivery id: %d %+v", code, env.Error)
	}
	left, _, err := st.AgentDB.Captures(t.Context(), agentdb.CaptureFilter{DeliveryID: delivery, Page: storage.Page{Limit: 10}})
	if err != nil || len(left) != 0 {
		t.Fatalf("after delete by delivery id, %d captures of it are left (the replay is one of them): %v", len(left), err)
	}
}
