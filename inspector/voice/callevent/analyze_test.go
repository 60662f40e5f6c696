package callevent

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 14, 15, 0, 0, 0, time.UTC)

// callEvents turns generated payloads into captured events, each received
// one second after it occurred.
func callEvents(t *testing.T, ps []Payload) []CallEvent {
	t.Helper()
	var out []CallEvent
	for _, p := range ps {
		body, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		at, err := ParseTime(p.OccurredAt)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, CallEvent{CaptureID: "cap-" + p.Event, Event: p.Event, DeliveryID: p.ID, OccurredAt: at, ReceivedAt: at.Add(time.Second), Body: body})
	}
	return out
}

func completed(t *testing.T) []CallEvent {
	return callEvents(t, CallSpec{Start: t0}.Events())
}

func codes(s CallSummary) []string {
	var out []string
	for _, a := range s.Anomalies {
		out = append(out, a.Code)
	}
	return out
}

func anomaly(s CallSummary, code string) *Anomaly {
	for i := range s.Anomalies {
		if s.Anomalies[i].Code == code {
			return &s.Anomalies[i]
		}
	}
	return nil
}

func TestAnalyzeCompletedCall(t *testing.T) {
	evs := completed(t)
	// Shuffled input comes out in the order of occurrence.
	shuffled := []CallEvent{evs[3], evs[0], evs[4], evs[2], evs[1]}
	s := AnalyzeCall(shuffled, t0.Add(time.Hour), 0)
	var got []string
	for _, e := range s.Events {
		got = append(got, e.Event)
	}
	if !reflect.DeepEqual(got, []string{KindStarted, KindConnected, KindEnded, KindRecordingAvailable, KindAnalysisCompleted}) {
		t.Errorf("order %v", got)
	}
	if len(s.Anomalies) != 0 {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
	if s.State != StateEnded || s.Final != KindEnded || s.Analysis == nil || s.Media == nil || s.Call == nil ||
		s.Call.Disposition == nil || *s.Call.Disposition != "interested" || s.FirstAt != evs[0].ReceivedAt || s.LastAt != evs[4].ReceivedAt {
		t.Errorf("summary %+v", s)
	}
}

func TestAnalyzeFailedCall(t *testing.T) {
	evs := callEvents(t, CallSpec{Start: t0, Flow: FlowFailed, OutcomeCode: "no_answer"}.Events())
	s := AnalyzeCall(evs, t0.Add(time.Hour), 0)
	if s.State != StateFailed || s.OutcomeCode != "no_answer" || len(s.Anomalies) != 0 {
		t.Errorf("summary %+v", s)
	}
}

func TestAnalyzeDuplicatesAreNotAnomalies(t *testing.T) {
	evs := completed(t)
	retry := evs[2]
	retry.CaptureID, retry.ReceivedAt = "cap-retry", retry.ReceivedAt.Add(30*time.Second)
	retry.Duplicate = true
	replay := evs[2]
	replay.CaptureID, replay.ReceivedAt = "cap-replay", retry.ReceivedAt.Add(time.Hour) // same delivery id, not flagged
	s := AnalyzeCall(append(evs, retry, replay), t0.Add(2*time.Hour), 0)
	if len(s.Anomalies) != 0 {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
	if len(s.Events) != 7 {
		t.Errorf("duplicates dropped from events: %d", len(s.Events))
	}
}

func TestAnalyzeEndedAndFailed(t *testing.T) {
	evs := completed(t)[:3]
	failed := callEvents(t, CallSpec{Start: t0, Flow: FlowFailed, RingFor: 3 * time.Second}.Events())[1]
	failed.CaptureID = "cap-failed"
	s := AnalyzeCall(append(evs, failed), t0.Add(time.Minute), time.Hour)
	a := anomaly(s, AnomalyEndedAndFailed)
	if a == nil || len(a.CaptureIDs) != 2 {
		t.Fatalf("anomalies %+v", s.Anomalies)
	}
	// The failure occurred first (after ringing), so it is the final one
	// and the connection after it is out of place.
	if s.Final != KindFailed || anomaly(s, AnomalyAfterFinal) == nil {
		t.Errorf("final %s, anomalies %v", s.Final, codes(s))
	}
}

func TestAnalyzeMultipleEnded(t *testing.T) {
	evs := completed(t)
	second := evs[2]
	second.CaptureID, second.DeliveryID = "cap-ended-2", "another-delivery"
	s := AnalyzeCall(append(evs, second), t0.Add(time.Hour), 0)
	if a := anomaly(s, AnomalyMultipleEnded); a == nil || len(a.CaptureIDs) != 2 {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
	evs = callEvents(t, CallSpec{Start: t0, Flow: FlowFailed}.Events())
	second = evs[1]
	second.CaptureID, second.DeliveryID = "cap-failed-2", "another-delivery"
	if s := AnalyzeCall(append(evs, second), t0.Add(time.Hour), 0); anomaly(s, AnomalyMultipleFailed) == nil {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
}

func TestAnalyzeEventsAfterFinal(t *testing.T) {
	evs := completed(t)
	late := evs[1]
	late.CaptureID, late.DeliveryID = "cap-late-connected", "d-late"
	late.OccurredAt = evs[2].OccurredAt.Add(5 * time.Second)
	late.ReceivedAt = late.OccurredAt
	s := AnalyzeCall(append(evs, late), t0.Add(time.Hour), 0)
	if a := anomaly(s, AnomalyAfterFinal); a == nil || !reflect.DeepEqual(a.CaptureIDs, []string{"cap-late-connected"}) {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
	// Recording and analysis after a failure are out of place too.
	f := callEvents(t, CallSpec{Start: t0, Flow: FlowFailed}.Events())
	rec := evs[3]
	rec.OccurredAt, rec.ReceivedAt = f[1].OccurredAt.Add(time.Minute), f[1].ReceivedAt.Add(time.Minute)
	if s := AnalyzeCall(append(f, rec), t0.Add(time.Hour), 0); anomaly(s, AnomalyAfterFinal) == nil {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
}

func TestAnalyzeAnalysisBeforeEnded(t *testing.T) {
	evs := completed(t)
	// call.ended was retried and arrived after the analysis.
	evs[2].ReceivedAt = evs[4].ReceivedAt.Add(30 * time.Second)
	s := AnalyzeCall(evs, t0.Add(time.Hour), 0)
	var outOfOrder []Anomaly
	for _, a := range s.Anomalies {
		if a.Code == AnomalyOutOfOrder {
			outOfOrder = append(outOfOrder, a)
		}
	}
	if len(outOfOrder) != 2 {
		t.Fatalf("want analysis-before-ended and ended-after-recording, got %+v", s.Anomalies)
	}
	if !reflect.DeepEqual(outOfOrder[0].CaptureIDs, []string{"cap-call.analysis_completed", "cap-call.ended"}) {
		t.Errorf("analysis before ended: %+v", outOfOrder[0])
	}
	if !reflect.DeepEqual(outOfOrder[1].CaptureIDs, []string{"cap-call.ended", "cap-call.recording_available"}) {
		t.Errorf("ended after recording: %+v", outOfOrder[1])
	}
}

func TestAnalyzeAnalysisPending(t *testing.T) {
	evs := completed(t)[:4]
	endedAt := evs[2].ReceivedAt
	if s := AnalyzeCall(evs, endedAt.Add(4*time.Minute), 5*time.Minute); len(s.Anomalies) != 0 {
		t.Errorf("pending too early: %+v", s.Anomalies)
	}
	s := AnalyzeCall(evs, endedAt.Add(6*time.Minute), 5*time.Minute)
	if a := anomaly(s, AnomalyAnalysisPending); a == nil || !reflect.DeepEqual(a.CaptureIDs, []string{"cap-call.ended"}) {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
	if anomaly(s, AnomalyMissingEvents) != nil {
		t.Errorf("recording was received; missing reported: %+v", s.Anomalies)
	}
	// The default threshold is used for a non-positive one.
	if s := AnalyzeCall(evs, endedAt.Add(DefaultAnalysisPendingAfter-time.Second), 0); anomaly(s, AnomalyAnalysisPending) != nil {
		t.Error("default threshold not applied")
	}
}

func TestAnalyzeMissingEvents(t *testing.T) {
	evs := completed(t)
	// Only ended and analysis: started, connected and recording are missing.
	s := AnalyzeCall([]CallEvent{evs[2], evs[4]}, t0.Add(time.Hour), 0)
	a := anomaly(s, AnomalyMissingEvents)
	if a == nil || a.Message != "never received call.started, call.connected, call.recording_available, which a call subscribed to all six events gets" {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
	// A call in progress that connected without starting.
	s = AnalyzeCall([]CallEvent{evs[1]}, t0.Add(time.Hour), 0)
	if a := anomaly(s, AnomalyMissingEvents); a == nil || s.State != StateInProgress {
		t.Errorf("summary %+v", s)
	}
	// Just started: nothing is missing yet.
	if s := AnalyzeCall(evs[:1], t0.Add(time.Hour), 0); len(s.Anomalies) != 0 {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
	// Recording not yet overdue is not missing.
	if s := AnalyzeCall(evs[:3], evs[2].ReceivedAt.Add(time.Minute), 0); len(s.Anomalies) != 0 {
		t.Errorf("anomalies %+v", s.Anomalies)
	}
}

func TestAnalyzeToleratesJunk(t *testing.T) {
	evs := []CallEvent{
		{CaptureID: "a", Event: KindEnded, Body: []byte("not json"), ReceivedAt: t0},
		{CaptureID: "b", Event: "", Body: nil},
		{CaptureID: "c", Event: "call.transferred", Body: []byte(`{"event":"call.transferred","call":5}`), ReceivedAt: t0.Add(time.Second)},
	}
	s := AnalyzeCall(evs, t0.Add(time.Hour), 0)
	if s.State != StateEnded || len(s.Events) != 3 {
		t.Errorf("summary %+v", s)
	}
	if s := AnalyzeCall(nil, t0, 0); s.State != StateInProgress || s.Anomalies == nil {
		t.Errorf("empty: %+v", s)
	}
}

// TestAnalyzeEachAnomalyCode gives one call per anomaly code, each with
// exactly the anomalies it should have, and checks that every code in
// AnomalyCodes has its case.
func TestAnalyzeEachAnomalyCode(t *testing.T) {
	evs := completed(t)
	failedCall := callEvents(t, CallSpec{Start: t0, Flow: FlowFailed}.Events())
	again := func(e CallEvent, id string) CallEvent {
		e.CaptureID, e.DeliveryID = "cap-"+id, id
		return e
	}
	lateConnected := again(evs[1], "late")
	lateConnected.OccurredAt = evs[2].OccurredAt.Add(5 * time.Second)
	lateConnected.ReceivedAt = lateConnected.OccurredAt
	endedRetried := append([]CallEvent(nil), evs...)
	endedRetried[2].ReceivedAt = evs[4].ReceivedAt.Add(30 * time.Second)
	cases := []struct {
		code   string
		events []CallEvent
		now    time.Time
		want   []string
	}{
		{AnomalyEndedAndFailed, append(evs[:3:3], again(failedCall[1], "f")), t0.Add(time.Minute),
			[]string{AnomalyEndedAndFailed}},
		{AnomalyMultipleEnded, append(evs[:5:5], again(evs[2], "e2")), t0.Add(time.Hour),
			[]string{AnomalyMultipleEnded}},
		{AnomalyMultipleFailed, append(failedCall[:2:2], again(failedCall[1], "f2")), t0.Add(time.Hour),
			[]string{AnomalyMultipleFailed}},
		{AnomalyAfterFinal, append(evs[:5:5], lateConnected), t0.Add(time.Hour),
			[]string{AnomalyAfterFinal}},
		{AnomalyOutOfOrder, endedRetried, t0.Add(time.Hour),
			[]string{AnomalyOutOfOrder, AnomalyOutOfOrder}},
		{AnomalyAnalysisPending, evs[:4], evs[2].ReceivedAt.Add(time.Hour),
			[]string{AnomalyAnalysisPending}},
		{AnomalyMissingEvents, []CallEvent{evs[0], evs[2]}, evs[2].ReceivedAt.Add(time.Minute),
			[]string{AnomalyMissingEvents}},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		s := AnalyzeCall(c.events, c.now, 0)
		if got := codes(s); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: anomalies %v, want %v (%+v)", c.code, got, c.want, s.Anomalies)
		}
		for _, a := range s.Anomalies {
			if a.Message == "" || a.CaptureIDs == nil {
				t.Errorf("%s: anomaly without message or captures: %+v", c.code, a)
			}
		}
		covered[c.code] = true
	}
	for _, code := range AnomalyCodes {
		if !covered[code] {
			t.Errorf("no case for anomaly code %s", code)
		}
	}
}
