package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

func queuedID(t *testing.T, resp *http.Response, body string) string {
	t.Helper()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d, want 202: %s", resp.StatusCode, body)
	}
	var env struct {
		Data struct {
			ID     string `json:"id"`
			Queued bool   `json:"queued"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &env); err != nil || env.Data.ID == "" || !env.Data.Queued {
		t.Fatalf("202 body does not say queued with an id: %s", body)
	}
	return env.Data.ID
}

func TestOfflineQueueDeliversInOrderExactlyOnce(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	st.StopAgent()
	const n = 100
	ids := map[string]bool{}
	for i := 0; i < n; i++ {
		resp, body := post(t, st.TunnelURL+"/hook", fmt.Sprintf(`{"seq":%d}`, i))
		ids[queuedID(t, resp, body)] = true
	}
	if len(ids) != n {
		t.Fatalf("%d distinct queue ids", len(ids))
	}
	if len(rec.all()) != 0 {
		t.Fatal("handler reached while the agent was away")
	}
	st.StartAgent()
	polltest.Until(t, 20*time.Second, func() bool { return len(rec.all()) >= n }, "queued requests were not delivered")
	// New traffic after the drain goes through live again.
	polltest.Until(t, 10*time.Second, func() bool {
		resp, _ := post(t, st.TunnelURL+"/hook", `{"seq":"live"}`)
		return resp.StatusCode == http.StatusCreated
	}, "live traffic did not resume after the drain")
	got := rec.all()
	for i := 0; i < n; i++ {
		if want := fmt.Sprintf(`{"seq":%d}`, i); string(got[i].Body) != want {
			t.Fatalf("delivery %d was %s, want %s (order lost)", i, got[i].Body, want)
		}
	}
	if string(got[n].Body) != `{"seq":"live"}` {
		t.Fatalf("extra delivery %s: a queued request arrived twice", got[n].Body)
	}
	// Each is marked queued in the agent, with when it reached the relay.
	caps, count, err := st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 200}})
	if err != nil {
		t.Fatal(err)
	}
	if count != n+1 {
		t.Fatalf("agent stored %d captures, want %d", count, n+1)
	}
	late := 0
	for _, c := range caps {
		if c.Queued {
			late++
			if c.ArrivedAt.IsZero() || c.ArrivedAt.After(c.CreatedAt) || !ids[c.RelayID] {
				t.Errorf("queued capture %s: arrived %v saved %v relay id %q", c.ID, c.ArrivedAt, c.CreatedAt, c.RelayID)
			}
		}
	}
	if late != n {
		t.Errorf("%d captures marked queued, want %d", late, n)
	}
	stats, _ := st.RelayDB.QueueStatsByTunnel(context.Background())
	if stats[st.TunnelID].Count != 0 {
		t.Errorf("relay still holds %d", stats[st.TunnelID].Count)
	}
}

func TestQueueSurvivesRelayRestart(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	st.StopAgent()
	for i := 0; i < 10; i++ {
		resp, body := post(t, st.TunnelURL+"/hook", fmt.Sprintf(`{"seq":%d}`, i))
		queuedID(t, resp, body)
	}
	st.StopRelay()
	st.StartRelay()
	st.StartAgent()
	polltest.Until(t, 20*time.Second, func() bool { return len(rec.all()) == 10 }, "queue lost across a relay restart")
	for i, r := range rec.all() {
		if string(r.Body) != fmt.Sprintf(`{"seq":%d}`, i) {
			t.Fatalf("delivery %d: %s", i, r.Body)
		}
	}
}

func TestOfflineRejectAndQueueFull(t *testing.T) {
	_, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, NoAgent: true, Relay: func(c *relay.Config) { c.QueueMaxCount = 3 }})
	for i := 0; i < 3; i++ {
		resp, body := post(t, st.TunnelURL, "{}")
		queuedID(t, resp, body)
	}
	resp, body := post(t, st.TunnelURL, "{}")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || errorCode(t, body) != "queue_full" {
		t.Errorf("full queue: %d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	st2 := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, NoAgent: true, Relay: func(c *relay.Config) { c.Offline = relay.OfflineReject }})
	resp, body = post(t, st2.TunnelURL, "{}")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || errorCode(t, body) != "agent_offline" {
		t.Errorf("reject mode: %d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

func TestSecondAgentTakesOver(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	first := st.ClientErr
	second, err := tunnel.NewClient(tunnel.Config{RelayURL: st.RelayURL, Token: st.Token, Handler: replyHandler{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go second.Run(ctx)
	select {
	case err := <-first:
		if !errors.Is(err, tunnel.ErrReplaced) {
			t.Fatalf("older agent ended with %v, want ErrReplaced", err)
		}
		// One error, said once: the relay's message, not the client's
		// own words with the relay's after them in brackets.
		for _, phrase := range []string{"took over", "another agent connected with the same token"} {
			if n := strings.Count(err.Error(), phrase); n != 1 {
				t.Errorf("the error says %q %d times, want once: %v", phrase, n, err)
			}
		}
	case <-time.After(time.Minute):
		t.Fatal("the older agent was not told to go")
	}
	polltest.Until(t, 5*time.Second, func() bool {
		resp, body := post(t, st.TunnelURL, "{}")
		return resp.StatusCode == 299 && body == "second"
	}, "the newer agent did not get the traffic")
	if len(rec.all()) != 0 {
		t.Error("the replaced agent still forwarded")
	}
}

// replyHandler answers every request itself with 299 "second".
type replyHandler struct{}

func (replyHandler) ServeTunnel(r *wire.Request, s *tunnel.Stream) {
	s.Ack()
	s.Respond(&wire.Response{Status: 299, Body: []byte("second")})
	s.Release()
}

func TestRequireHeader(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Client: func(c *tunnel.Config) {
		c.RequireHeaders = []string{"Authorization: Bearer s3cret"}
	}})
	resp, body := post(t, st.TunnelURL, "{}")
	if resp.StatusCode != 401 || errorCode(t, body) != "sender_not_accepted" {
		t.Fatalf("without the header: %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest("POST", st.TunnelURL, strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer wrong")
	resp, _ = http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("wrong secret: %d", resp.StatusCode)
	}
	req, _ = http.NewRequest("POST", st.TunnelURL, strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, _ = http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 201 || len(rec.all()) != 1 {
		t.Fatalf("with the header: %d, handler saw %d", resp.StatusCode, len(rec.all()))
	}
	polltest.Until(t, 5*time.Second, func() bool { return st.Agent.TunnelState().Rejected == 2 }, "the agent was not told how many were refused")
}

func TestRateAndInFlightLimits(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	rec, h := startHandler(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			<-release
		}
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the handler closes
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) {
		c.RateLimit, c.RateBurst, c.MaxInFlight = 1, 5, 2
	}})
	// Two requests held in the handler fill the in-flight allowance.
	done := make(chan int, 2)
	for i := 0; i < 2; i++ {
		go func() {
			resp, err := http.Post(st.TunnelURL+"/hold", "text/plain", nil)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	polltest.Until(t, 5*time.Second, func() bool { return len(rec.all()) == 2 }, "held requests did not arrive")
	resp, body := post(t, st.TunnelURL+"/x", "{}")
	if resp.StatusCode != 503 || errorCode(t, body) != "unavailable" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("in-flight limit: %d %s", resp.StatusCode, body)
	}
	once.Do(func() { close(release) })
	<-done
	<-done
	// The burst is spent by now; the next ones are rate limited.
	for i := 0; i < 10; i++ {
		resp, body = post(t, st.TunnelURL+"/x", "{}")
		if resp.StatusCode == 429 {
			break
		}
	}
	if resp.StatusCode != 429 || errorCode(t, body) != "rate_limited" {
		t.Fatalf("rate limit: %d %s", resp.StatusCode, body)
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 {
		t.Errorf("Retry-After = %q", resp.Header.Get("Retry-After"))
	}
}

func TestHealthAndMetrics(t *testing.T) {
	_, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	post(t, st.TunnelURL, "{}")
	resp, err := http.Get(st.RelayURL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v", err)
	}
	resp.Body.Close()
	resp, err = http.Get(st.RelayURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"calltap_tunnels_connected 1", `calltap_requests_total{class="2xx"} 1`, "calltap_queue_depth 0", "calltap_bytes_in_total 2"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q:\n%s", want, b)
		}
	}
}

// A queued request the agent saved but did not send before it stopped is
// sent when the agent starts again.
func TestSavedButUnsentQueuedRequestIsSentOnRestart(t *testing.T) {
	rec, h := startHandler(t, nil)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	st.StopAgent()
	db, err := agentdb.OpenAgent(context.Background(), st.Dir+"/agent.db")
	if err != nil {
		t.Fatal(err)
	}
	c := &agentdb.Capture{ID: "6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c01", RelayID: "r-1", Source: "tunnel", CreatedAt: time.Now(), ArrivedAt: time.Now(),
		Queued: true, Method: "POST", Path: "/late", Body: []byte(`{"late":true}`), Duration: -1}
	if _, err := db.WriteCaptures(context.Background(), []*agentdb.Capture{c}, nil); err != nil {
		t.Fatal(err)
	}
	db.Close()
	st.StartAgent()
	polltest.Until(t, 10*time.Second, func() bool { return len(rec.all()) == 1 }, "the saved queued request was not sent")
	if r := rec.all()[0]; string(r.Body) != `{"late":true}` || r.Path != "/late" {
		t.Errorf("sent %s %s", r.Path, r.Body)
	}
}

// slowHandler records requests in the order they reach it and answers 201
// after a moment, so that a drain takes a while.
func slowHandler(t *testing.T) (*recorder, *httptest.Server) {
	return startHandler(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond) // a handler's work, not a wait for readiness
		w.WriteHeader(http.StatusCreated)
	})
}

// queueWhileAway queues n requests {"seq":0}… for an absent agent.
func queueWhileAway(t *testing.T, st *stacktest.Stack, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		resp, body := post(t, st.TunnelURL+"/hook", fmt.Sprintf(`{"seq":%d}`, i))
		queuedID(t, resp, body)
	}
}

// relayQueueEmpty waits until the relay has handed its whole queue over.
func relayQueueEmpty(t *testing.T, st *stacktest.Stack) {
	t.Helper()
	polltest.Until(t, 10*time.Second, func() bool {
		stats, err := st.RelayDB.QueueStatsByTunnel(context.Background())
		return err == nil && stats[st.TunnelID].Count == 0
	}, "the relay did not hand its queue over")
}

// sendInOrder sends {"seq":from}…{"seq":to-1} one after another, so their
// arrival order is known, and checks each sender's answer.
func sendInOrder(t *testing.T, st *stacktest.Stack, from, to int) (answered, queued int) {
	t.Helper()
	for i := from; i < to; i++ {
		resp, body := post(t, st.TunnelURL+"/hook", fmt.Sprintf(`{"seq":%d}`, i))
		switch resp.StatusCode {
		case http.StatusCreated:
			answered++
		case http.StatusAccepted:
			queuedID(t, resp, body)
			queued++
		default:
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	return answered, queued
}

// handlerSawInOrder waits for n deliveries and checks they are
// {"seq":0}…{"seq":n-1}, each once.
func handlerSawInOrder(t *testing.T, rec *recorder, n int) {
	t.Helper()
	polltest.Until(t, 30*time.Second, func() bool { return len(rec.all()) >= n }, "not every request reached the handler")
	got := rec.all()
	var order []string
	bad := false
	for i, r := range got {
		order = append(order, strings.TrimSuffix(strings.TrimPrefix(string(r.Body), `{"seq":`), "}"))
		if i >= n || string(r.Body) != fmt.Sprintf(`{"seq":%d}`, i) {
			bad = true
		}
	}
	if bad {
		t.Fatalf("the handler saw %d requests in this order, want 0…%d each once: %s", len(got), n-1, strings.Join(order, " "))
	}
}

// Requests sent while the agent delivers what was queued in its absence
// reach the handler after it, in arrival order, and their senders still get
// the handler's answer.
func TestNewRequestsDuringDrainKeepArrivalOrder(t *testing.T) {
	// The handler holds every request until the relay has handed its whole
	// queue over, so the queue is still being delivered when the new
	// requests come, however slow the machine.
	handedOver := make(chan struct{})
	rec, h := startHandler(t, func(w http.ResponseWriter, r *http.Request) {
		<-handedOver
		time.Sleep(20 * time.Millisecond) // a handler's work, not a wait for readiness
		w.WriteHeader(http.StatusCreated)
	})
	var openOnce sync.Once
	open := func() { openOnce.Do(func() { close(handedOver) }) }
	t.Cleanup(open) // a failed wait must not leave the handler blocked
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	st.StopAgent()
	const queued, fresh = 100, 20
	queueWhileAway(t, st, queued)
	st.StartAgent()
	relayQueueEmpty(t, st)
	open()
	// From here on the relay sends each new request live, while the agent
	// is still delivering the queue to the handler.
	if len(rec.all()) >= queued {
		t.Fatal("the handler finished the queue too soon for this test to mean anything")
	}
	answered, _ := sendInOrder(t, st, queued, queued+fresh)
	handlerSawInOrder(t, rec, queued+fresh)
	if answered == 0 {
		t.Error("no sender got the handler's answer; with the default forward timeout they all should")
	}
}

// A new request that would wait behind the queue longer than the relay's
// forward timeout is answered 202, like a queued one, and reaches the
// handler later, in order.
func TestNewRequestWaitingPastForwardTimeoutIsQueued(t *testing.T) {
	// The handler holds the queue until every new request was answered:
	// each of them waits past the forward timeout, however fast the
	// machine.
	hold := make(chan struct{})
	rec, h := startHandler(t, func(w http.ResponseWriter, r *http.Request) {
		<-hold
		w.WriteHeader(http.StatusCreated)
	})
	var openOnce sync.Once
	open := func() { openOnce.Do(func() { close(hold) }) }
	t.Cleanup(open) // a failed wait must not leave the handler blocked
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, Relay: func(c *relay.Config) { c.ForwardTimeout = 4 * time.Second }})
	st.StopAgent()
	const queued, fresh = 10, 4
	queueWhileAway(t, st, queued)
	st.StartAgent()
	relayQueueEmpty(t, st)
	_, deferred := sendInOrder(t, st, queued, queued+fresh)
	if deferred != fresh {
		t.Errorf("%d of the %d senders held behind the queue were answered 202", deferred, fresh)
	}
	open()
	handlerSawInOrder(t, rec, queued+fresh)
	// Each was saved once and its answer recorded (the last answer's record
	// may still be on its way to the store when the handler has seen all).
	var caps []*agentdb.Capture
	var count int
	var unrecorded []string
	t.Cleanup(func() {
		if t.Failed() && len(unrecorded) > 0 {
			t.Logf("captures without their answer recorded:\n%s", strings.Join(unrecorded, "\n"))
		}
	})
	polltest.Until(t, polltest.MinWait, func() bool {
		var err error
		st.Agent.Flush(context.Background())
		caps, count, err = st.AgentDB.Captures(context.Background(), agentdb.CaptureFilter{Page: storage.Page{Limit: 200}})
		if err != nil {
			t.Fatal(err)
		}
		unrecorded = unrecorded[:0]
		for _, c := range caps {
			if c.ResponseStatus == 0 {
				unrecorded = append(unrecorded, fmt.Sprintf("%s %s status=%s attempts=%d queued=%v error=%q", c.ID, c.Body, c.Status, c.Attempts, c.Queued, c.Error))
			}
		}
		return len(unrecorded) == 0
	}, "answers the handler gave were not recorded")
	if count != queued+fresh {
		t.Fatalf("agent stored %d captures, want %d", count, queued+fresh)
	}
	late := 0
	for _, c := range caps {
		if c.ResponseStatus != http.StatusCreated {
			t.Errorf("capture %s: response %d recorded, want 201", c.ID, c.ResponseStatus)
		}
		if c.Queued {
			late++
		}
	}
	// Those answered 202 by the agent are marked queued like the relay's own,
	// so that a restart before their turn still sends them.
	if late != queued+deferred {
		t.Errorf("%d captures marked queued, want %d", late, queued+deferred)
	}
}

// Queued requests an earlier run saved but did not send go to the handler
// before a request that arrives once the agent is back.
func TestUnsentQueuedRequestsGoBeforeNewOnes(t *testing.T) {
	rec, h := slowHandler(t)
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL})
	st.StopAgent()
	db, err := agentdb.OpenAgent(context.Background(), st.Dir+"/agent.db")
	if err != nil {
		t.Fatal(err)
	}
	const unsent = 30
	var cs []*agentdb.Capture
	for i := 0; i < unsent; i++ {
		cs = append(cs, &agentdb.Capture{ID: fmt.Sprintf("6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e%04d", i), RelayID: fmt.Sprintf("r-%d", i), Source: "tunnel",
			CreatedAt: time.Now(), ArrivedAt: time.Now(), Queued: true, Method: "POST", Path: "/hook", Body: []byte(fmt.Sprintf(`{"seq":%d}`, i)), Duration: -1})
	}
	if _, err := db.WriteCaptures(context.Background(), cs, nil); err != nil {
		t.Fatal(err)
	}
	db.Close()
	st.StartAgent()
	sendInOrder(t, st, unsent, unsent+3)
	handlerSawInOrder(t, rec, unsent+3)
}
