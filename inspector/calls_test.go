package inspector_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/agentdb"
)

func callsOpenDB(t *testing.T) *agentdb.AgentStore {
	t.Helper()
	db, err := agentdb.OpenAgent(context.Background(), filepath.Join(t.TempDir(), "agent.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// callsCapture stores payloads as the agent would, received at the given
// times, and returns the captures.
func callsCapture(t *testing.T, db *agentdb.AgentStore, at time.Time, ps ...callevent.Payload) []*agentdb.Capture {
	t.Helper()
	var caps []*agentdb.Capture
	for i, p := range ps {
		body, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		caps = append(caps, callsCaptureBody(at.Add(time.Duration(i)*time.Second), body))
	}
	if _, err := db.WriteCaptures(context.Background(), caps, nil); err != nil {
		t.Fatal(err)
	}
	return caps
}

func callsCaptureBody(at time.Time, body []byte) *agentdb.Capture {
	ix, _ := callevent.Index(body)
	return &agentdb.Capture{ID: uuid.NewString(), Source: "tunnel", CreatedAt: at, Method: "POST", Path: "/hook", Body: body,
		Event: ix.Event, CallID: ix.CallID, DeliveryID: ix.DeliveryID, OccurredAt: ix.OccurredAt}
}

type callsEnvelope struct {
	Status bool            `json:"status"`
	Data   json.RawMessage `json:"data"`
	Error  *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type callsPage struct {
	Count   int                      `json:"count"`
	Limit   int                      `json:"limit"`
	Offset  int                      `json:"offset"`
	Results []inspector.CallListItem `json:"results"`
}

func callsGet(t *testing.T, url string, data any) (int, callsEnvelope) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env callsEnvelope
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	if data != nil && env.Status {
		if err := json.Unmarshal(env.Data, data); err != nil {
			t.Fatalf("%s: %v\n%s", url, err, env.Data)
		}
	}
	return resp.StatusCode, env
}

func pageIDs(p callsPage) []string {
	var out []string
	for _, r := range p.Results {
		out = append(out, r.CallID)
	}
	return out
}

func TestCallsAPI(t *testing.T) {
	db := callsOpenDB(t)
	now := time.Now().UTC()
	start := now.Add(-2 * time.Hour)

	// D: ended an hour ago, no analysis since.
	d := callevent.CallSpec{Start: start}.Events()
	callsCapture(t, db, now.Add(-time.Hour), d[:4]...)
	// A: a complete call, call.ended delivered twice (a retry).
	a := callevent.CallSpec{Start: start}.Events()
	aCaps := callsCapture(t, db, now.Add(-30*time.Minute), a...)
	retry := callsCaptureBody(now.Add(-29*time.Minute), aCaps[2].Body)
	if _, err := db.WriteCaptures(context.Background(), []*agentdb.Capture{retry}, nil); err != nil {
		t.Fatal(err)
	}
	// B: busy.
	b := callevent.CallSpec{Start: start, Flow: callevent.FlowFailed, OutcomeCode: "busy"}.Events()
	callsCapture(t, db, now.Add(-20*time.Minute), b...)
	// C: ended and failed.
	c := callevent.CallSpec{Start: start}.Events()[:3]
	cFailed := callevent.CallSpec{CallID: c[0].Call.CallID, Start: start, Flow: callevent.FlowFailed, OutcomeCode: "no_answer"}.Events()[1]
	callsCapture(t, db, now.Add(-10*time.Minute), append(c, cFailed)...)

	mux := http.NewServeMux()
	inspector.CallRoutes(mux, db, 15*time.Minute)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	base := srv.URL + "/api/v1/ext/calls/"
	A, B, C, D := a[0].Call.CallID, b[0].Call.CallID, c[0].Call.CallID, d[0].Call.CallID

	var p callsPage
	if st, env := callsGet(t, base, &p); st != 200 || !env.Status {
		t.Fatalf("list: %d %+v", st, env)
	}
	if p.Count != 4 || p.Limit != 50 || !reflect.DeepEqual(pageIDs(p), []string{C, B, A, D}) {
		t.Fatalf("list: %+v", p)
	}
	byID := map[string]inspector.CallListItem{}
	for _, r := range p.Results {
		byID[r.CallID] = r
	}
	if it := byID[A]; it.State != "ended" || it.EventCount != 6 || len(it.Anomalies) != 0 || it.LeadScore == nil ||
		it.Disposition == nil || *it.Disposition != "interested" || it.ContactName == "" || it.LastEvent != callevent.KindAnalysisCompleted ||
		!reflect.DeepEqual(it.Kinds, []string{callevent.KindStarted, callevent.KindConnected, callevent.KindEnded, callevent.KindRecordingAvailable, callevent.KindAnalysisCompleted}) {
		t.Errorf("A: %+v", it)
	}
	if it := byID[B]; it.State != "failed" || it.OutcomeCode != "busy" || it.FinalEvent != callevent.KindFailed {
		t.Errorf("B: %+v", it)
	}
	if it := byID[D]; len(it.Anomalies) != 1 || it.Anomalies[0].Code != callevent.AnomalyAnalysisPending {
		t.Errorf("D: %+v", it.Anomalies)
	}

	for _, tc := range []struct {
		query string
		count int
		ids   []string
	}{
		{"?event=call.failed", 2, []string{C, B}},
		{"?outcome_code=busy", 1, []string{B}},
		{"?anomaly=ended_and_failed", 1, []string{C}},
		{"?anomaly=analysis_pending", 1, []string{D}},
		{"?anomaly=any", 2, []string{C, D}},
		{"?anomaly=any&limit=1&offset=1", 2, []string{D}},
		{"?anomaly=any&offset=5", 2, nil},
		{"?limit=2&offset=1", 4, []string{B, A}},
		{"?limit=500", 4, []string{C, B, A, D}},
		{"?event=call.transferred", 0, nil},
	} {
		var p callsPage
		if st, env := callsGet(t, base+tc.query, &p); st != 200 || !env.Status {
			t.Errorf("%s: %d %+v", tc.query, st, env)
			continue
		}
		if p.Count != tc.count || !reflect.DeepEqual(pageIDs(p), tc.ids) || p.Results == nil {
			t.Errorf("%s: count %d ids %v, want %d %v", tc.query, p.Count, pageIDs(p), tc.count, tc.ids)
		}
		if tc.query == "?limit=500" && p.Limit != 200 {
			t.Errorf("limit 500 served as %d", p.Limit)
		}
	}
	for _, q := range []string{"?limit=x", "?offset=-1", "?anomaly=weird"} {
		if st, env := callsGet(t, base+q, nil); st != 400 || env.Status || env.Error == nil || env.Error.Code != "invalid_request" {
			t.Errorf("%s: %d %+v", q, st, env)
		}
	}

	var det inspector.CallDetail
	var raw struct {
		Call     map[string]any `json:"call"`
		Analysis map[string]any `json:"analysis"`
		Media    map[string]any `json:"media"`
	}
	st, env := callsGet(t, base+A+"/", &det)
	if st != 200 {
		t.Fatalf("detail: %d %+v", st, env)
	}
	json.Unmarshal(env.Data, &raw)
	if len(det.Events) != 6 || det.Events[0].Event != callevent.KindStarted || det.Events[5].Event != callevent.KindAnalysisCompleted {
		t.Errorf("events: %+v", det.Events)
	}
	dups := 0
	for _, e := range det.Events {
		if e.Duplicate {
			dups++
			if e.Event != callevent.KindEnded || e.DuplicateOf != aCaps[2].ID {
				t.Errorf("duplicate: %+v", e)
			}
		}
		if e.CheckErrors != 0 || e.ReceivedAt == nil || e.OccurredAt == "" {
			t.Errorf("event: %+v", e)
		}
	}
	if dups != 1 {
		t.Errorf("%d duplicates", dups)
	}
	if raw.Call["call_id"] != A || raw.Analysis["lead_score"] == nil || raw.Media["recording_url"] == nil || det.MediaFiles == nil {
		t.Errorf("detail blocks: %+v", raw)
	}

	st, env = callsGet(t, base+C+"/", &det)
	codes := []string{}
	for _, an := range det.Anomalies {
		codes = append(codes, an.Code)
	}
	if st != 200 || len(codes) == 0 || codes[0] != callevent.AnomalyEndedAndFailed {
		t.Errorf("C anomalies %v", codes)
	}
	if st, env := callsGet(t, base+"no-such-call/", nil); st != 404 || env.Error == nil || env.Error.Code != "not_found" {
		t.Errorf("unknown call: %d %+v", st, env)
	}
}
