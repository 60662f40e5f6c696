package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
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
	st := startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: func(c agent.Config) (*agent.Agent, error) {
		store := c.Store
		return agent.NewWritingThrough(c, func(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error) {
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
		_, n, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 10}})
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
	st := startStack(t, stackOptions{ForwardTo: dead})
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
	caps, n, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 10}})
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
	st := startStack(t, stackOptions{ForwardTo: hs.URL})
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
		caps, _, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 10}})
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

// Requests in flight together commit through the committer's loop (planAlongside), and each one's
// answer goes to the relay once both its commit and its handler are done,
// whichever ends first: here odd ones are answered by the handler before
// their commit (which waits for that), even ones after (the handler waits
// for the commit). Every sender gets its own handler's answer, and only
// after its request was saved.
func TestCrowdAnswersAfterCommitEitherWay(t *testing.T) {
	const n = 24
	var mu sync.Mutex
	answered := map[string]chan struct{}{}  // closed once the handler has answered (odd)
	committed := map[string]chan struct{}{} // closed once the capture is committed
	committedAt := map[string]time.Time{}
	for i := range n {
		b := fmt.Sprintf(`{"n":%d}`, i)
		answered[b], committed[b] = make(chan struct{}), make(chan struct{})
	}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var v struct{ N int }
		json.Unmarshal(body, &v)
		if v.N%2 == 0 {
			<-committed[string(body)]
		}
		w.Write(bytes.ToUpper(body))
		if v.N%2 == 1 {
			close(answered[string(body)])
		}
	}))
	defer hs.Close()
	st := startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: func(c agent.Config) (*agent.Agent, error) {
		store := c.Store
		return agent.NewWritingThrough(c, func(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error) {
			for _, c := range inserts {
				var v struct{ N int }
				json.Unmarshal(c.Body, &v)
				if v.N%2 == 1 {
					<-answered[string(c.Body)]
				}
			}
			w, err := store.LogCaptures(ctx, inserts, updates)
			mu.Lock()
			for _, c := range inserts {
				committedAt[string(c.Body)] = time.Now()
				close(committed[string(c.Body)])
			}
			mu.Unlock()
			return w, err
		})
	}})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			b := fmt.Sprintf(`{"n":%d}`, i)
			resp, err := http.Post(st.TunnelURL+"/hook", "application/json", strings.NewReader(b))
			if err != nil {
				t.Error(err)
				return
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			at := time.Now()
			mu.Lock()
			saved, ok := committedAt[b]
			mu.Unlock()
			if resp.StatusCode != 200 || string(got) != strings.ToUpper(b) {
				t.Errorf("%s: answered %d %q, want 200 %q", b, resp.StatusCode, got, strings.ToUpper(b))
			}
			if !ok || saved.After(at) {
				t.Errorf("%s: answered before its capture was committed", b)
			}
		})
	}
	wg.Wait()
	if err := st.Agent.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	caps, count, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if count != n {
		t.Fatalf("stored %d captures, want %d", count, n)
	}
	for _, c := range caps {
		if c.ResponseStatus != 200 || c.Attempts != 1 {
			t.Errorf("capture %s: response %d, %d attempts recorded", c.ID, c.ResponseStatus, c.Attempts)
		}
	}
}

// An answer whose commit fails is kept and recorded once the disk has room
// again, without a request to carry it: here the disk refuses every commit
// with answers in it until freed, so the first answer fails in the loop's
// commit and again in the next lone request's (which its sender is told
// failed, as a live request whose save fails is).
func TestAnswerOfFailedCommitIsRecordedLater(t *testing.T) {
	var full atomic.Bool
	var refused atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	defer hs.Close()
	full.Store(true)
	st := startStack(t, stackOptions{ForwardTo: hs.URL, NewAgent: func(c agent.Config) (*agent.Agent, error) {
		store := c.Store
		return agent.NewWritingThrough(c, func(ctx context.Context, inserts, updates []*agentdb.Capture) ([]agentdb.Written, error) {
			if full.Load() && len(updates) > 0 {
				refused.Add(1)
				return nil, fmt.Errorf("storage: append: %w", syscall.ENOSPC)
			}
			return store.LogCaptures(ctx, inserts, updates)
		})
	}})
	post := func(body string) int {
		resp, err := http.Post(st.TunnelURL+"/hook", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(`{"first":true}`); code != http.StatusAccepted {
		t.Fatalf("first request: %d", code)
	}
	polltest.Until(t, 10*time.Second, func() bool { return refused.Load() > 0 }, "the first answer's commit was never tried")
	if code := post(`{"second":true}`); code != http.StatusServiceUnavailable {
		t.Fatalf("a request whose save failed: %d, want 503", code)
	}
	full.Store(false)
	polltest.Until(t, 10*time.Second, func() bool {
		caps, _, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 10}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range caps {
			if c.ResponseStatus == http.StatusAccepted {
				return true
			}
		}
		return false
	}, "the first answer was never recorded once the disk had room")
}
