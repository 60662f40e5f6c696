package agent_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// A relay that took the agent for frozen queued a copy of a live request
// the agent had saved and answered (its answer lost with the connection):
// the copy comes back queued, with the same relay id, on the agent's next
// connection. The agent acknowledges it, so that the relay's queue empties,
// and neither saves it again nor hands it to the handler a second time.
func TestQueuedCopyOfASavedLiveRequestIsNotSentAgain(t *testing.T) {
	var firsts, seconds atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), `"d1"`) {
			firsts.Add(1)
		} else {
			seconds.Add(1)
		}
	}))
	defer hs.Close()
	st := startStack(t, stackOptions{ForwardTo: hs.URL})
	body := `{"id":"d1","event":"call.started","call":{"call_id":"c1"}}`
	if code, _ := post(t, st.TunnelURL+"/hook", body); code != http.StatusOK {
		t.Fatalf("live request: %d", code)
	}
	// The peer named it req_1; its copy, as the relay queues one.
	st.peer.enqueue(&wire.Request{ID: "req_1", ArrivedAt: time.Now().UnixMicro(), Method: "POST", URI: "/hook", Body: []byte(body)})
	polltest.Until(t, 10*time.Second, func() bool { return st.peer.held() == 0 }, "the agent did not acknowledge the queued copy")
	// A request queued after it is delivered: the copy held nothing up.
	st.peer.enqueue(&wire.Request{ID: "req_x", ArrivedAt: time.Now().UnixMicro(), Method: "POST", URI: "/hook", Body: []byte(`{"id":"d2"}`)})
	polltest.Until(t, 10*time.Second, func() bool { return seconds.Load() == 1 }, "the request queued after the copy was not delivered")
	if n := firsts.Load(); n != 1 {
		t.Fatalf("the handler got the request %d times, want once: the copy was sent again", n)
	}
	st.Agent.Flush(context.Background())
	cs, err := st.AgentDB.CapturesAfter(context.Background(), agentdb.CaptureFilter{}, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 {
		t.Fatalf("the store holds %d captures, want 2 (the copy saved again?)", len(cs))
	}
}
