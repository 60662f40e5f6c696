package callevent

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func kinds(ps []Payload) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Event
	}
	return out
}

func TestEventsCompletedFlow(t *testing.T) {
	start := time.Date(2025, 3, 14, 15, 0, 0, 0, time.UTC)
	spec := CallSpec{Start: start, RingFor: 5 * time.Second, TalkFor: 60 * time.Second, RecordingAfter: 10 * time.Second,
		AnalysisAfter: 40 * time.Second, MediaBaseURL: "http://127.0.0.1:9/m/", ExpiresIn: 600, Variables: map[string]any{"lead_id": "EZ-1"}}
	ps := spec.Events()
	want := []string{KindStarted, KindConnected, KindEnded, KindRecordingAvailable, KindAnalysisCompleted}
	if got := kinds(ps); !reflect.DeepEqual(got, want) {
		t.Fatalf("kinds %v", got)
	}
	ids := map[string]bool{}
	callID := ps[0].Call.CallID
	var prev time.Time
	for i, p := range ps {
		body, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		// Every generated payload passes the contract checks.
		if errs := errorsOf(Check(body)); len(errs) > 0 {
			t.Errorf("%s: %+v", p.Event, errs)
		}
		for _, f := range Check(body) {
			if f.Severity == SevWarning {
				t.Errorf("%s: warning %+v", p.Event, f)
			}
		}
		ix, ok := Index(body)
		if !ok || ix.Event != p.Event || ix.CallID != callID || ix.DeliveryID != p.ID {
			t.Errorf("%s: index %+v %v", p.Event, ix, ok)
		}
		if ids[p.ID] || !IsUUID(p.ID) {
			t.Errorf("delivery id %q repeated or not a UUID", p.ID)
		}
		ids[p.ID] = true
		if p.Call.CallID != callID || p.Call.Variables["lead_id"] != "EZ-1" {
			t.Errorf("%s: call block %+v", p.Event, p.Call)
		}
		at, err := ParseTime(p.OccurredAt)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && at.Before(prev) {
			t.Errorf("%s occurred before the previous event", p.Event)
		}
		prev = at
		var data map[string]any
		if err := json.Unmarshal(p.Data, &data); err != nil || data["event"] == nil || data["room"].(map[string]any)["sid"] == nil {
			t.Errorf("data %s", p.Data)
		}
	}
	if ps[0].OccurredAt != "2025-03-14T15:00:00.000000+00:00" || *ps[2].Call.EndedAt != "2025-03-14T15:01:05.000000+00:00" ||
		*ps[2].Call.DurationSeconds != 60 || ps[4].OccurredAt != "2025-03-14T15:01:45.000000+00:00" {
		t.Errorf("timestamps: %s %s %d %s", ps[0].OccurredAt, *ps[2].Call.EndedAt, *ps[2].Call.DurationSeconds, ps[4].OccurredAt)
	}
	last := ps[4]
	if last.Analysis == nil || last.Analysis.LeadScore == nil || last.Media == nil || last.Media.ExpiresIn != 600 ||
		!strings.HasPrefix(last.Media.RecordingURL, "http://127.0.0.1:9/m/calls/"+callID+"/") {
		t.Errorf("analysis/media: %+v %+v", last.Analysis, last.Media)
	}
	// The story the events tell has no anomaly.
	var evs []CallEvent
	for i, p := range ps {
		body, _ := json.Marshal(p)
		at, _ := ParseTime(p.OccurredAt)
		evs = append(evs, CallEvent{CaptureID: p.ID, Event: p.Event, DeliveryID: p.ID, OccurredAt: at, ReceivedAt: at.Add(time.Duration(i) * time.Millisecond), Body: body})
	}
	sum := AnalyzeCall(evs, prev.Add(time.Hour), time.Minute)
	if len(sum.Anomalies) != 0 || sum.State != StateEnded || sum.CallID != callID {
		t.Errorf("summary: %+v", sum)
	}
}

func TestEventsFailedFlow(t *testing.T) {
	for _, code := range OutcomeCodes {
		ps := CallSpec{Flow: FlowFailed, OutcomeCode: code}.Events()
		if got := kinds(ps); !reflect.DeepEqual(got, []string{KindStarted, KindFailed}) {
			t.Fatalf("kinds %v", got)
		}
		f := ps[1]
		if f.Call.OutcomeCode == nil || *f.Call.OutcomeCode != code || f.Call.AnsweredAt != nil {
			t.Errorf("%s: %+v", code, f.Call)
		}
		body, _ := json.Marshal(f)
		if errs := errorsOf(Check(body)); len(errs) > 0 {
			t.Errorf("%s: %+v", code, errs)
		}
	}
	if ps := (CallSpec{Flow: FlowFailed}).Events(); *ps[1].Call.OutcomeCode != "busy" {
		t.Errorf("default outcome code %q", *ps[1].Call.OutcomeCode)
	}
}

func TestEventsDefaultsAndIdentity(t *testing.T) {
	a, b := CallSpec{}.Events(), CallSpec{}.Events()
	if a[0].Call.CallID == b[0].Call.CallID || !IsUUID(a[0].Call.CallID) || !IsUUID(a[0].Call.CampaignID) {
		t.Errorf("call ids: %q %q", a[0].Call.CallID, b[0].Call.CallID)
	}
	c := a[0].Call
	if c.FromNumber != DefaultFrom || c.ToNumber != DefaultTo || c.Contact.Phone != DefaultTo || c.Agent.Name == "" {
		t.Errorf("defaults: %+v", c)
	}
	// Editing one event's contact does not edit the next one's.
	a[0].Call.Contact.Name = "changed"
	if a[1].Call.Contact.Name == "changed" {
		t.Error("events share their contact")
	}
	spec := CallSpec{CallID: "11111111-2222-4333-8444-555555555555", Contact: Contact{Name: "Ana Ruiz", Phone: "+34600000001", CustomFields: map[string]any{"city": "Madrid"}}}
	ps := spec.Events()
	if ps[0].Call.CallID != spec.CallID || ps[0].Call.ToNumber != "+34600000001" || ps[0].Call.Contact.CustomFields["city"] != "Madrid" {
		t.Errorf("spec not used: %+v", ps[0].Call)
	}
}

func TestSetPath(t *testing.T) {
	p := CallSpec{}.Events()[4]
	m, err := p.ToMap()
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{
		{"call.variables.lead_id", "EZ-1"},
		{"call.variables.crm_id", "4412"},
		{"call.variables.flags", `{"vip":true}`},
		{"call.outcome_code", "null"},
		{"analysis.extracted_responses.0.answer", "No"},
		{"brand_new.nested.key", "v"},
		{"call.variables.note", `"quoted"`},
		{"call.variables.spaced", "hello world"},
	} {
		if err := SetPath(m, kv[0], kv[1]); err != nil {
			t.Fatalf("%s: %v", kv[0], err)
		}
	}
	b, _ := json.Marshal(m)
	var back map[string]any
	json.Unmarshal(b, &back)
	vars := back["call"].(map[string]any)["variables"].(map[string]any)
	if vars["lead_id"] != "EZ-1" || vars["crm_id"] != 4412.0 || vars["flags"].(map[string]any)["vip"] != true || vars["note"] != "quoted" || vars["spaced"] != "hello world" {
		t.Errorf("variables: %v", vars)
	}
	if back["call"].(map[string]any)["outcome_code"] != nil {
		t.Error("null not set")
	}
	if back["analysis"].(map[string]any)["extracted_responses"].([]any)[0].(map[string]any)["answer"] != "No" {
		t.Error("array index not followed")
	}
	if back["brand_new"].(map[string]any)["nested"].(map[string]any)["key"] != "v" {
		t.Error("objects not created")
	}
	for _, bad := range []string{"", "call..x", "event.x", "analysis.extracted_responses.9.answer", "analysis.extracted_responses.x"} {
		if err := SetPath(m, bad, "1"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestRewriteMediaURLs(t *testing.T) {
	p := CallSpec{MediaBaseURL: "https://media.example.com"}.Events()[4]
	body, _ := json.Marshal(p) // & is written \u0026: the rewrite must find it anyway
	body = append([]byte("  "), body...)
	out, n := RewriteMediaURLs(body, func(field, url string) (string, bool) {
		if url != p.Media.RecordingURL && url != p.Media.TranscriptURL {
			t.Errorf("%s: got url %q", field, url)
		}
		return "http://127.0.0.1:4040/api/v1/ext/media/" + field, true
	})
	if n != 2 {
		t.Fatalf("%d replaced", n)
	}
	var back Payload
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	if back.Media.RecordingURL != "http://127.0.0.1:4040/api/v1/ext/media/recording_url" ||
		back.Media.TranscriptURL != "http://127.0.0.1:4040/api/v1/ext/media/transcript_url" || back.Media.ExpiresIn != p.Media.ExpiresIn {
		t.Errorf("media %+v", back.Media)
	}
	// Everything before the media block is byte-identical.
	i := strings.Index(string(body), `"media"`)
	if string(out[:i]) != string(body[:i]) {
		t.Error("bytes before media changed")
	}

	// Only the chosen fields; a refusal keeps the value.
	out, n = RewriteMediaURLs(body, func(field, url string) (string, bool) { return "x", field == FieldTranscriptURL })
	if n != 1 || !strings.Contains(string(out), `"transcript_url":"x"`) {
		t.Errorf("%d %s", n, out)
	}
	for _, in := range []string{`not json`, `{"media":{"recording_url":5}}`, `{"media":null}`, `{}`, `{"media":{"recording_url":"a"}`, `{"data":{"media":{"recording_url":"a"}}}`} {
		out, n := RewriteMediaURLs([]byte(in), func(string, string) (string, bool) { return "b", true })
		if n != 0 || string(out) != in {
			t.Errorf("%s: %d %s", in, n, out)
		}
	}
}

// A call generated without a start is one that has just ended: sent at
// once, none of its events occurs after it was sent, and the last one
// occurs about now.
func TestEventsWithoutStartEndNow(t *testing.T) {
	for _, flow := range []string{FlowCompleted, FlowFailed} {
		before := time.Now()
		ps := CallSpec{Flow: flow}.Events()
		sent := time.Now()
		var last time.Time
		for _, p := range ps {
			at, err := ParseTime(p.OccurredAt)
			if err != nil {
				t.Fatalf("%s %s: occurred_at %q: %v", flow, p.Event, p.OccurredAt, err)
			}
			if at.After(sent) {
				t.Errorf("%s: %s occurs %s after it was made", flow, p.Event, at.Sub(sent))
			}
			if at.After(last) {
				last = at
			}
		}
		if last.Before(before.Add(-time.Second)) {
			t.Errorf("%s: the last event occurred %s before the call was made, want about now", flow, before.Sub(last))
		}
	}
}
