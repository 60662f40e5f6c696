package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage"
)

// A request alone in the tunnel is committed by its own goroutine between
// writing it to the handler and reading the answer: the handler must
// still get it without waiting for the commit, and the sender's answer
// must still mean it is saved. The commit here waits until the handler
// has the request; had the request waited for the commit, neither would
// ever happen.
func TestLoneRequestReachesHandlerBeforeItsCommit(t *testing.T) {
	reached := make(chan struct{}, 16)
	h := &handler{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		reached <- struct{}{}
	}))
	defer hs.Close()
	var waitedOut atomic.Int32
	st := inspectortest.Start(t, inspectortest.Options{ForwardTo: hs.URL, Agent: func(c *agent.Config) {
		store := c.Store
		agent.SetWriteCaptures(c, func(ctx context.Context, inserts, updates []*storage.Capture) ([]storage.Written, error) {
			for range inserts {
				select {
				case <-reached:
				case <-time.After(10 * time.Second):
					waitedOut.Add(1)
				}
			}
			return store.LogCaptures(ctx, inserts, updates)
		})
	}})
	for i := range 3 {
		start := time.Now()
		send(t, st.TunnelURL+"/hook", `{"lone":true}`)
		if waitedOut.Load() > 0 {
			t.Fatalf("request %d: the commit came before the handler had the request (answered after %s)", i, time.Since(start))
		}
		// Answered 200, so saved: a read sees it at once.
		_, n, err := st.AgentDB.Captures(context.Background(), storage.CaptureFilter{Page: storage.Page{Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		if n != i+1 {
			t.Fatalf("after %d answers the store holds %d captures", i+1, n)
		}
	}
	if h.count() != 3 {
		t.Errorf("the handler got %d requests, want 3", h.count())
	}
}

// A request alone whose handler cannot be reached never calls the commit
// from inside the exchange: it is saved all the same, with its failure,
// before the sender is told.
func TestLoneRequestToDeadHandlerIsSaved(t *testing.T) {
	hs := httptest.NewServer(http.NotFoundHandler())
	dead := hs.URL
	hs.Close()
	st := inspectortest.Start(t, inspectortest.Options{ForwardTo: dead})
	resp, err := http.Post(st.TunnelURL+"/hook", "application/json", strings.NewReader(`{"dead":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("a request to a dead handler: %d, want 502", resp.StatusCode)
	}
	if err := st.Agent.Flush(context.Background()); err != nil { // the failure's record
		t.Fatal(err)
	}
	caps, n, err := st.AgentDB.Captures(context.Background(), storage.CaptureFilter{Page: storage.Page{Limit: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("stored %d captures, want the one request", n)
	}
	if caps[0].Error == "" || caps[0].ResponseStatus != 0 {
		t.Errorf("stored with error %q and response %d, want the handler's failure recorded", caps[0].Error, caps[0].ResponseStatus)
	}
}

// The handler's answer is recorded with the next commit, whoever makes it;
// when no request follows, it is still recorded, unprompted, soon after:
// a store read that neither flushes nor settles the agent sees it.
func TestLastAnswerIsRecordedUnprompted(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer hs.Close()
	st := inspectortest.Start(t, inspectortest.Options{ForwardTo: hs.URL})
	for i := range 3 {
		resp, err := http.Post(st.TunnelURL+"/hook", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	polltest.Until(t, 10*time.Second, func() bool {
		caps, _, err := st.AgentDB.Captures(context.Background(), storage.CaptureFilter{Page: storage.Page{Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		recorded := 0
		for _, c := range caps {
			if c.ResponseStatus == http.StatusCreated && c.Attempts == 1 {
				recorded++
			}
		}
		return recorded == 3
	}, "the answers of the last requests were never recorded")
}
