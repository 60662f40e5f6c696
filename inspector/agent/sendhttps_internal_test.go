package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/calltap/calltap/relay/wire"
)

// An https target is tried through net/http's client: its answer is read
// up to the smaller of the agent's and the relay's limits, and one over
// it fails as too large, naming whose limit.
func TestSendToHTTPSTarget(t *testing.T) {
	hs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Answer", "yes")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(strings.Repeat("a", 100)))
	}))
	defer hs.Close()
	d := openDisk(t)
	a, err := New(Config{Store: d.store, ForwardTo: hs.URL, MaxBody: 100, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.cm.answers.timer.Stop()
	a.client = hs.Client()
	c := a.newCapture(SourceTunnel, "POST", "/hook", wire.Header{{Name: "Host", Value: "public.example"}}, []byte("{}"))
	if !strings.HasPrefix(c.Target, "https://") {
		t.Fatalf("target %q", c.Target)
	}
	ctx := context.Background()
	res := a.send(ctx, c, nil, wire.Limits{}, nil)
	if res.status != http.StatusCreated || len(res.body) != 100 || res.header.Get("X-Answer") != "yes" || res.err != "" {
		t.Fatalf("an answer of the agent's limit: %d, %d bytes, error %q", res.status, len(res.body), res.err)
	}
	res = a.send(ctx, c, nil, wire.Limits{MaxBody: 99}, nil)
	if !res.tooLarge || !strings.Contains(res.err, "relay's limit of 99 bytes") {
		t.Errorf("an answer over the relay's limit: too large %v, %q", res.tooLarge, res.err)
	}
	res = a.send(ctx, c, nil, wire.Limits{MaxFrame: 120}, nil)
	if !res.tooLarge || !strings.Contains(res.err, "relay's limit of 120 bytes per frame") {
		t.Errorf("an answer within the body limits, over the relay's frame: too large %v, %q", res.tooLarge, res.err)
	}
	a.cfg.MaxBody = 99
	for _, relayMax := range []int64{1000, 99} { // the same limit is named the agent's
		res = a.send(ctx, c, nil, wire.Limits{MaxBody: relayMax}, nil)
		if !res.tooLarge || !strings.Contains(res.err, "agent's limit of 99 bytes") {
			t.Errorf("an answer over the agent's limit, the relay's %d: too large %v, %q", relayMax, res.tooLarge, res.err)
		}
	}
	hs.Close()
	if res := a.send(ctx, c, nil, wire.Limits{}, nil); res.err == "" || res.status != 0 {
		t.Errorf("a closed target: %d, %q", res.status, res.err)
	}
}
