package cluster_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
)

// A stamped request is one delivery id, sent until a node answers 2xx,
// each try marked with its number: the handler can tell which try reached
// it, and the ledger what that try's sender was answered, and when.
type try struct {
	id string
	n  int
}

type outcome struct {
	status  int
	at      time.Time
	unknown bool // a 5xx coded outcome_unknown: the request may have reached the handler
}

// ledger is what senders were answered and what reached the handler.
type ledger struct {
	mu       sync.Mutex
	answered map[try]outcome     // guarded by mu
	arrived  map[try][]time.Time // guarded by mu
	order    []try               // guarded by mu; arrivals in order, for the failure message

	// unknownIsNoAnswer lets a try answered outcome_unknown reach the
	// handler after its answer, as one that got no answer may: set where
	// the test makes queueing unconfirmable (a cut link), not where it
	// checks that an unconfirmed request is retracted.
	unknownIsNoAnswer bool
}

func newLedger() *ledger {
	return &ledger{answered: map[try]outcome{}, arrived: map[try][]time.Time{}}
}

// ServeHTTP is the developer's handler: it records the try that reached it.
func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var ev struct {
		ID  string `json:"id"`
		Try int    `json:"try"`
	}
	b, _ := io.ReadAll(r.Body)
	json.Unmarshal(b, &ev)
	l.mu.Lock()
	k := try{ev.ID, ev.Try}
	l.arrived[k] = append(l.arrived[k], time.Now())
	l.order = append(l.order, k)
	l.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (l *ledger) reached(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.arrived {
		if k.id == id {
			return true
		}
	}
	return false
}

// send delivers id as the voice service does: tries in turn on urls until
// one answers 2xx, a moment apart.
func (l *ledger) send(t *testing.T, urls []string, path, id string) {
	client := http.Client{Timeout: time.Minute} // bounds a hang
	deadline := time.Now().Add(2 * time.Minute)
	for n := 1; ; n++ {
		body := fmt.Sprintf(`{"id":%q,"try":%d}`, id, n)
		status, unknown := 0, false
		resp, err := client.Post(urls[(n-1)%len(urls)]+path, "application/json", strings.NewReader(body))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			status, unknown = resp.StatusCode, strings.Contains(string(b), `"code":"outcome_unknown"`)
		}
		l.mu.Lock()
		l.answered[try{id, n}] = outcome{status, time.Now(), unknown}
		l.mu.Unlock()
		if status >= 200 && status < 300 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s was never answered 2xx: last %d %v", id, status, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settle sends a marker after a round and waits until it has reached the
// handler, and a second more: what a woken node or server still had for
// the handler has reached it by then, for check to find.
func (l *ledger) settle(t *testing.T, urls []string, path, marker string) {
	t.Helper()
	l.send(t, urls, path, marker)
	polltest.Until(t, 30*time.Second, func() bool { return l.reached(marker) }, "the round's marker did not reach the handler")
	time.Sleep(time.Second)
}

// check fails the test for every late copy: a try that reached the handler
// after its sender had been answered something other than 2xx. A try
// answered so that reached the handler before the answer is logged.
func (l *ledger) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	late, early, tries := 0, 0, 0
	for k, o := range l.answered {
		tries++
		if (o.status >= 200 && o.status < 300) || (o.unknown && l.unknownIsNoAnswer) {
			continue
		}
		for _, at := range l.arrived[k] {
			if at.After(o.at) {
				late++
				t.Errorf("late copy: %s try %d reached the handler %s after its sender was answered %d",
					k.id, k.n, at.Sub(o.at).Round(time.Millisecond), o.status)
			} else {
				early++
				t.Logf("%s try %d reached the handler, then its sender was answered %d", k.id, k.n, o.status)
			}
		}
	}
	t.Logf("%d tries, %d late copies, %d copies answered non-2xx after they arrived", tries, late, early)
}

// startLedgerHandler serves l as the developer's local handler.
func startLedgerHandler(t *testing.T, l *ledger) string {
	ts := httptest.NewServer(l)
	t.Cleanup(ts.Close)
	return ts.URL
}
