package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/polltest"
)

// scripted answers with the given statuses in turn, then 200.
type scripted struct {
	mu       sync.Mutex
	statuses []int
	at       []time.Time
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = append(s.at, time.Now())
	code := 200
	if len(s.statuses) > 0 {
		code, s.statuses = s.statuses[0], s.statuses[1:]
	}
	w.WriteHeader(code)
}

func (s *scripted) calls() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

func TestReplayWithServiceRetrySchedule(t *testing.T) {
	ok := &scripted{}
	hs := httptest.NewServer(ok)
	defer hs.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL})
	send(t, st.TunnelURL, event("call.ended", "c-9", 9))
	_, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/", "")
	var p page
	json.Unmarshal(env.Data, &p)
	orig := p.Results[0].ID

	cases := []struct {
		name     string
		statuses []int
		attempts int
		final    string
	}{
		{"5xx, 429 and 408 are retried until a 2xx", []int{500, 429, 408}, 4, "delivered"},
		{"a 404 stops at once", []int{404}, 1, "failed"},
		{"five attempts at most", []int{503, 503, 503, 503, 503, 503}, 5, "failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			target := &scripted{statuses: tc.statuses}
			ts := httptest.NewServer(target)
			defer ts.Close()
			// Scale 0.001: the 42-minute schedule takes 2.5 seconds.
			code, env := inspectortest.Do(t, "POST", st.InspectorURL+"/api/v1/ext/webhooks/replay/",
				fmt.Sprintf(`{"id":%q,"to":%q,"retry":"service","time_scale":0.001}`, orig, ts.URL))
			var rr struct {
				ID     string `json:"id"`
				Status string `json:"status"`
				Queued bool   `json:"queued"`
			}
			json.Unmarshal(env.Data, &rr)
			if code != 200 || !rr.Queued {
				t.Fatalf("replay: %d %+v", code, rr)
			}
			var d struct {
				Status     string `json:"status"`
				Attempts   int    `json:"attempts"`
				AttemptLog []struct {
					N              int  `json:"n"`
					ResponseStatus *int `json:"response_status"`
				} `json:"attempt_log"`
			}
			polltest.Until(t, 10*time.Second, func() bool {
				_, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/"+rr.ID+"/", "")
				json.Unmarshal(env.Data, &d)
				return d.Status != "pending" && len(d.AttemptLog) == d.Attempts
			}, "the replay did not finish")
			if d.Status != tc.final || d.Attempts != tc.attempts || len(target.calls()) != tc.attempts {
				t.Fatalf("status %s after %d attempts (handler saw %d), want %s after %d", d.Status, d.Attempts, len(target.calls()), tc.final, tc.attempts)
			}
			for i, a := range d.AttemptLog {
				if a.N != i+1 || a.ResponseStatus == nil {
					t.Errorf("attempt %d: %+v", i, a)
				}
			}
			// Each gap is at least the schedule's delay, scaled.
			at := target.calls()
			for i := 1; i < len(at); i++ {
				if gap, min := at[i].Sub(at[i-1]), time.Duration(float64(callevent.RetrySchedule()[i])*0.001); gap < min {
					t.Errorf("attempt %d came %v after the previous one, before the scheduled %v", i+1, gap, min)
				}
			}
		})
	}
	if n := len(ok.calls()); n != 1 {
		t.Errorf("the original handler saw %d requests", n)
	}
}
