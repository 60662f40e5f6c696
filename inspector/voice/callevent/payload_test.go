package callevent

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"testing"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sameJSON reports whether a and b hold the same JSON value.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	if err := da.Decode(&va); err != nil {
		t.Fatalf("decode %s: %v", a, err)
	}
	if err := db.Decode(&vb); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func TestPayloadDecodesDocumentedFields(t *testing.T) {
	var p Payload
	if err := json.Unmarshal(readFixture(t, "analysis_completed.json"), &p); err != nil {
		t.Fatal(err)
	}
	if p.Event != KindAnalysisCompleted || p.ID != "5b2f7c1e-8a4d-4f3b-9c2e-1d7a6b5c4e3f" {
		t.Errorf("envelope: %+v", p)
	}
	c := p.Call
	if c == nil || c.CallID != "0e8f3a52-6c1b-4d7e-9f20-3a4b5c6d7e8f" || c.Direction != "outbound" || c.OutcomeCode != nil ||
		c.Disposition == nil || *c.Disposition != "interested" || c.DurationSeconds == nil || *c.DurationSeconds != 94 ||
		c.Agent == nil || c.Agent.Name != "Ava" || c.Contact == nil || c.Contact.CustomFields["city"] != "Austin" ||
		c.Variables["lead_id"] != "EZ-1" {
		t.Errorf("call block: %+v", c)
	}
	if p.Analysis == nil || p.Analysis.LeadScore == nil || *p.Analysis.LeadScore != 0.82 || p.Analysis.Sentiment != "positive" ||
		len(p.Analysis.ExtractedResponses) != 1 || p.Analysis.ExtractedResponses[0].VariableName != "interested" {
		t.Errorf("analysis: %+v", p.Analysis)
	}
	if p.Media == nil || p.Media.ExpiresIn != 3600 || p.Media.RecordingURL == "" || p.Media.TranscriptURL == "" {
		t.Errorf("media: %+v", p.Media)
	}
	if len(p.Extra) != 0 || len(c.Extra) != 0 {
		t.Errorf("documented fields landed in Extra: %v %v", p.Extra, c.Extra)
	}
	if !bytes.Contains(p.Data, []byte(`"room_finished"`)) {
		t.Errorf("data not kept raw: %s", p.Data)
	}
}

func TestPayloadRoundTripKeepsEverything(t *testing.T) {
	for _, name := range []string{"analysis_completed.json", "failed.json", "broken.json"} {
		t.Run(name, func(t *testing.T) {
			in := readFixture(t, name)
			var p Payload
			if err := json.Unmarshal(in, &p); err != nil {
				t.Fatal(err)
			}
			out, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if !sameJSON(t, in, out) {
				t.Errorf("round trip changed the payload:\n in: %s\nout: %s", in, out)
			}
		})
	}
}

func TestPayloadKeepsUnknownFieldsAndMisfits(t *testing.T) {
	in := []byte(`{"id":"x","event":"call.ended","occurred_at":"2025-01-01T00:00:00Z","tenant":{"a":1},
		"call":{"call_id":"c","duration_seconds":"94","attempt_number":1.5,"status":null,"queue":"vip",
		"agent":{"id":"a","name":"Ava","team":"blue"},"contact":{"id":"k","custom_fields":{"n":1},"vip":true},"variables":[1]},
		"analysis":{"lead_score":"high"},"media":{"expires_in":"soon","cdn":"x"}}`)
	var p Payload
	if err := json.Unmarshal(in, &p); err != nil {
		t.Fatal(err)
	}
	if string(p.Extra["tenant"]) != `{"a":1}` {
		t.Errorf("unknown top-level field: %v", p.Extra)
	}
	c := p.Call
	for _, k := range []string{"duration_seconds", "attempt_number", "status", "queue", "variables"} {
		if _, ok := c.Extra[k]; !ok {
			t.Errorf("call.%s not kept in Extra: %v", k, c.Extra)
		}
	}
	if c.DurationSeconds != nil || c.AttemptNumber != 0 {
		t.Errorf("misfit values decoded: %+v", c)
	}
	if string(c.Agent.Extra["team"]) != `"blue"` || string(c.Contact.Extra["vip"]) != "true" {
		t.Errorf("agent/contact extra: %v %v", c.Agent.Extra, c.Contact.Extra)
	}
	if p.Analysis.LeadScore != nil || string(p.Analysis.Extra["lead_score"]) != `"high"` {
		t.Errorf("analysis: %+v", p.Analysis)
	}
	out, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	json.Unmarshal(out, &back)
	call := back["call"].(map[string]any)
	if call["duration_seconds"] != "94" || call["attempt_number"] != 1.5 || call["status"] != nil || call["queue"] != "vip" {
		t.Errorf("misfits not written back: %s", out)
	}
	if back["media"].(map[string]any)["expires_in"] != "soon" || back["tenant"] == nil {
		t.Errorf("not written back: %s", out)
	}
}

func TestPayloadRejectsOnlyNonObjects(t *testing.T) {
	var p Payload
	for _, in := range []string{`[]`, `"x"`, `null`, `{`} {
		if err := json.Unmarshal([]byte(in), &p); err == nil {
			t.Errorf("%s: no error", in)
		}
	}
	if err := json.Unmarshal([]byte(`{}`), &p); err != nil {
		t.Errorf("{}: %v", err)
	}
}

func TestMarshalWritesDocumentedOrder(t *testing.T) {
	p := Payload{ID: "i", Event: KindStarted, OccurredAt: "t", Call: &Call{CallID: "c"}, Data: json.RawMessage(`{}`)}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"i","event":"call.started","occurred_at":"t","call":{"call_id":"c",`
	if !bytes.HasPrefix(b, []byte(want)) {
		t.Errorf("got %s", b)
	}
	if bytes.Contains(b, []byte(`"analysis"`)) || bytes.Contains(b, []byte(`"media"`)) {
		t.Errorf("nil blocks written: %s", b)
	}
}
