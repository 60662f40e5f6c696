package trigger

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/wire"
)

type received struct {
	header http.Header
	body   []byte
}

// handler records what it receives and answers with status.
type handler struct {
	mu     sync.Mutex
	got    []received // guarded by mu
	status int
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.got = append(h.got, received{r.Header.Clone(), body})
	h.mu.Unlock()
	w.Header().Set("X-Handler", "yes")
	w.WriteHeader(h.status)
	io.WriteString(w, `{"ok":true}`)
}

// all returns what was received so far.
func (h *handler) all() []received {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]received(nil), h.got...)
}

func (h *handler) reset() {
	h.mu.Lock()
	h.got = nil
	h.mu.Unlock()
}

func newTarget(t *testing.T, status int) (*handler, string) {
	h := &handler{status: status}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return h, srv.URL + "/webhooks"
}

func decode(t *testing.T, b []byte) callevent.Payload {
	t.Helper()
	var p callevent.Payload
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunCompletedFlowWithHeadersAndSet(t *testing.T) {
	h, url := newTarget(t, http.StatusNoContent)
	res, err := Run(context.Background(), Options{
		URL:    url,
		Flow:   callevent.FlowCompleted,
		Set:    []string{"call.variables.lead_id=EZ-1", "analysis.lead_score=0.3", "tenant=acme"},
		Header: wire.Header{{Name: "Authorization", Value: "Bearer X"}, {Name: "X-Tag", Value: "a"}, {Name: "X-Tag", Value: "b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deliveries) != 5 || len(h.all()) != 5 || res.Failed() != 0 {
		t.Fatalf("%d deliveries, %d received, %d failed", len(res.Deliveries), len(h.all()), res.Failed())
	}
	want := []string{callevent.KindStarted, callevent.KindConnected, callevent.KindEnded, callevent.KindRecordingAvailable, callevent.KindAnalysisCompleted}
	for i, r := range h.all() {
		p := decode(t, r.body)
		if p.Event != want[i] || p.Call.CallID != res.CallID || p.Call.Variables["lead_id"] != "EZ-1" {
			t.Errorf("%d: %s %s %v", i, p.Event, p.Call.CallID, p.Call.Variables)
		}
		if string(p.Extra["tenant"]) != `"acme"` {
			t.Errorf("%d: new top-level member not set everywhere: %v", i, p.Extra)
		}
		if (p.Analysis != nil) != (p.Event == callevent.KindAnalysisCompleted) {
			t.Errorf("%d: --set analysis.* leaked to %s", i, p.Event)
		}
		if r.header.Get("Authorization") != "Bearer X" || !reflect.DeepEqual(r.header.Values("X-Tag"), []string{"a", "b"}) ||
			r.header.Get("Content-Type") != "application/json" {
			t.Errorf("%d: headers %v", i, r.header)
		}
		if errs := errorsOf(callevent.Check(r.body)); len(errs) > 0 {
			t.Errorf("%d: contract errors %+v", i, errs)
		}
		d := res.Deliveries[i]
		if d.Status != 204 || d.Event != p.Event || d.DeliveryID != p.ID || d.ResponseHeaders.Get("X-Handler") != "yes" || string(d.Payload) != string(r.body) {
			t.Errorf("%d: delivery %+v", i, d)
		}
	}
	last := decode(t, h.all()[4].body)
	if *last.Analysis.LeadScore != 0.3 {
		t.Errorf("lead score %v", *last.Analysis.LeadScore)
	}
}

func errorsOf(fs []callevent.Finding) []callevent.Finding {
	var out []callevent.Finding
	for _, f := range fs {
		if f.Severity == callevent.SevError {
			out = append(out, f)
		}
	}
	return out
}

func TestRunOneKindDuplicated(t *testing.T) {
	h, url := newTarget(t, http.StatusOK)
	res, err := Run(context.Background(), Options{URL: url, Kind: callevent.KindEnded, Duplicate: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.all()) != 2 || string(h.all()[0].body) != string(h.all()[1].body) {
		t.Fatalf("want the same delivery twice, got %d", len(h.all()))
	}
	if p := decode(t, h.all()[0].body); p.Event != callevent.KindEnded || p.Call.DurationSeconds == nil {
		t.Errorf("payload %+v", p)
	}
	if res.Deliveries[0].Copy != 1 || res.Deliveries[1].Copy != 2 || res.Deliveries[0].DeliveryID != res.Deliveries[1].DeliveryID {
		t.Errorf("deliveries %+v", res.Deliveries)
	}
}

func TestRunFailedFlow(t *testing.T) {
	h, url := newTarget(t, http.StatusOK)
	if _, err := Run(context.Background(), Options{URL: url, Flow: callevent.FlowFailed, OutcomeCode: "dispatch_error"}); err != nil {
		t.Fatal(err)
	}
	if len(h.all()) != 2 {
		t.Fatalf("%d received", len(h.all()))
	}
	p := decode(t, h.all()[1].body)
	if p.Event != callevent.KindFailed || *p.Call.OutcomeCode != "dispatch_error" {
		t.Errorf("%+v", p.Call)
	}
	// A single call.failed uses the outcome code too.
	h.reset()
	if _, err := Run(context.Background(), Options{URL: url, Kind: callevent.KindFailed, OutcomeCode: "no_answer"}); err != nil {
		t.Fatal(err)
	}
	if p := decode(t, h.all()[0].body); *p.Call.OutcomeCode != "no_answer" {
		t.Errorf("%+v", p.Call)
	}
}

func TestRunContactSpec(t *testing.T) {
	h, url := newTarget(t, http.StatusOK)
	spec := callevent.CallSpec{Contact: callevent.Contact{Name: "Ana Ruiz", Phone: "+34600000001", CustomFields: map[string]any{"city": "Madrid"}}}
	if _, err := Run(context.Background(), Options{URL: url, Kind: callevent.KindStarted, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	p := decode(t, h.all()[0].body)
	if p.Call.Contact.Name != "Ana Ruiz" || p.Call.ToNumber != "+34600000001" || p.Call.Contact.CustomFields["city"] != "Madrid" {
		t.Errorf("%+v", p.Call.Contact)
	}
}

func TestRunRecordsFailures(t *testing.T) {
	_, url := newTarget(t, http.StatusInternalServerError)
	res, err := Run(context.Background(), Options{URL: url, Kind: callevent.KindStarted})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed() != 1 || res.Deliveries[0].Status != 500 || res.Deliveries[0].ResponseBody != `{"ok":true}` {
		t.Errorf("%+v", res.Deliveries[0])
	}

	srv := httptest.NewServer(http.NotFoundHandler())
	down := srv.URL
	srv.Close()
	res, err = Run(context.Background(), Options{URL: down, Flow: callevent.FlowFailed})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed() != 2 || res.Deliveries[0].Error == "" || res.Deliveries[0].Status != 0 {
		t.Errorf("%+v", res.Deliveries)
	}
}

func TestRunBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"no url":             {Kind: callevent.KindEnded},
		"not http":           {URL: "ftp://x", Kind: callevent.KindEnded},
		"nothing to send":    {URL: "http://127.0.0.1:1"},
		"kind and flow":      {URL: "http://127.0.0.1:1", Kind: callevent.KindEnded, Flow: "completed"},
		"unknown kind":       {URL: "http://127.0.0.1:1", Kind: "call.ende"},
		"unknown flow":       {URL: "http://127.0.0.1:1", Flow: "done"},
		"outcome on ended":   {URL: "http://127.0.0.1:1", Kind: callevent.KindEnded, OutcomeCode: "busy"},
		"bad set":            {URL: "http://127.0.0.1:1", Kind: callevent.KindEnded, Set: []string{"novalue"}},
		"set through string": {URL: "http://127.0.0.1:1", Kind: callevent.KindEnded, Set: []string{"event.x=1"}},
	} {
		if _, err := Run(context.Background(), o); !errors.Is(err, ErrOptions) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	h, url := newTarget(t, http.StatusOK)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Options{URL: url, Flow: callevent.FlowCompleted}); !errors.Is(err, context.Canceled) {
		t.Errorf("err %v", err)
	}
	if len(h.all()) != 0 {
		t.Errorf("%d sent after cancel", len(h.all()))
	}
}

func TestParseHeader(t *testing.T) {
	f, err := ParseHeader("Authorization: Bearer X:Y")
	if err != nil || f.Name != "Authorization" || f.Value != "Bearer X:Y" {
		t.Errorf("%+v %v", f, err)
	}
	for _, bad := range []string{"NoColon", ": v", "Bad Name: v", "X: a\r\nY: b"} {
		if _, err := ParseHeader(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
