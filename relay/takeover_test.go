package relay_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/tunnel"
	"github.com/calltap/calltap/relay/tunnel/twintest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// Two agents on one token started at one instant: each time exactly one
// keeps the tunnel and gets its requests, and the other exits with one
// line. Before agent runs were ordered, each, sent away, came back "to
// make sure" and sent the other away: both exited, and the tunnel served
// nobody.
func TestTwinAgentsSettleOnOne(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	for round := range 20 {
		survivor, stop := twintest.Race(t, [2]string{st.RelayURL, st.RelayURL}, st.Token, time.Minute)
		polltest.Until(t, 10*time.Second, func() bool {
			resp, body := post(t, st.TunnelURL, "{}")
			return resp.StatusCode == twintest.Status && body == survivor
		}, "the agent that stayed does not get the tunnel's requests")
		if err := stop(); err != nil {
			t.Fatalf("round %d: the agent that stayed (%s) ended with %v", round, survivor, err)
		}
	}
}

// An agent whose connection was cut on its side only, the relay still
// holding the stale one, takes its tunnel back when it reconnects; a run
// that says it started before it is refused at once.
func TestAgentTakesItsTunnelBackAfterACut(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	p := startCutProxy(t, st.RelayAddr)
	connected := make(chan struct{}, 16)
	c, err := tunnel.NewClient(tunnel.Config{RelayURL: "http://" + p.addr(), Token: st.Token, Handler: replyHandler{},
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnState: func(s tunnel.ConnState) {
			if s.State == tunnel.StateConnected && s.Hello != nil && s.Notice == (wire.Notice{}) {
				connected <- struct{}{}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("the agent ended with %v", err)
		}
	}()
	waitConnected(t, connected, ran)
	p.cut()
	waitConnected(t, connected, ran)
	polltest.Until(t, 10*time.Second, func() bool {
		resp, body := post(t, st.TunnelURL, "{}")
		return resp.StatusCode == 299 && body == "second"
	}, "the reconnected agent does not get the tunnel's requests")

	if g := dialAs(t, st.RelayURL, st.Token, "1.older"); g.Reason != wire.GoAwayHeld {
		t.Fatalf("an agent run started earlier got goaway %+v, want GoAwayHeld", g)
	}
	resp, body := post(t, st.TunnelURL, "{}")
	if resp.StatusCode != 299 || body != "second" {
		t.Fatalf("after the refusal the tunnel answered %d %q", resp.StatusCode, body)
	}
}

// waitConnected waits for the client's next connection.
func waitConnected(t *testing.T, connected <-chan struct{}, ran <-chan error) {
	t.Helper()
	select {
	case <-connected:
	case err := <-ran:
		t.Fatalf("the agent exited: %v", err)
	case <-time.After(polltest.MinWait):
		t.Fatal("the agent did not connect")
	}
}

// dialAs opens an agent's websocket as the given run and returns the
// relay's goaway, its first frame.
func dialAs(t *testing.T, relayURL, token, instance string) wire.GoAway {
	t.Helper()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token)
	h.Set(wire.InstanceHeader, instance)
	d := websocket.Dialer{Subprotocols: []string{wire.Subprotocol}}
	conn, _, err := d.Dial("ws"+relayURL[len("http"):]+wire.ConnectPath, h)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, b, err := conn.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	g, err := wire.DecodeGoAway(b)
	if err != nil {
		t.Fatalf("the relay's first frame is 0x%02x, not a goaway: %v", b[0], err)
	}
	return g
}
