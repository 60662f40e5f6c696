package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaystate"
	"github.com/gorilla/websocket"
)

// claimPeer is an agent with claims, its side of the protocol spoken by
// hand: the relay's tests see exactly which agent was given what. It
// acknowledges every request it is given, and answers a live one 200 with
// its name, so that a sender's answer says which agent took its request.
type claimPeer struct {
	name  string
	ws    *websocket.Conn
	hello wire.Hello

	mu     sync.Mutex
	got    []*wire.Request // guarded by mu; in the order they came
	goaway []wire.GoAway   // guarded by mu

	done chan struct{} // closed when the read loop is over
}

// dialPeer connects an agent named name to st's relay with claims (none:
// the token's default agent), and waits for its hello.
func dialPeer(t *testing.T, st *stacktest.Stack, name string, claims ...string) *claimPeer {
	t.Helper()
	ws, resp, err := dialClaims(st, claims)
	if err != nil {
		t.Fatalf("%s: dial: %v (%s)", name, err, handshakeAnswer(resp))
	}
	p := &claimPeer{name: name, ws: ws, done: make(chan struct{})}
	_, b, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("%s: no hello: %v", name, err)
	}
	if err := wire.DecodeHello(b, &p.hello); err != nil {
		t.Fatalf("%s: the first frame is not a hello: %v", name, err)
	}
	go p.readLoop()
	t.Cleanup(p.close)
	return p
}

// dialClaims opens an agent's websocket to st's relay with claims.
func dialClaims(st *stacktest.Stack, claims []string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{"Authorization": {"Bearer " + st.Token}}
	for _, c := range claims {
		h.Add(wire.ClaimHeader, c)
	}
	d := websocket.Dialer{Subprotocols: []string{wire.Subprotocol}}
	return d.Dial(strings.Replace(st.RelayURL, "http", "ws", 1)+wire.ConnectPath, h)
}

// refusedDial connects with claims the relay must refuse before the
// upgrade, and returns its answer.
func refusedDial(t *testing.T, st *stacktest.Stack, claims ...string) (int, string) {
	t.Helper()
	ws, resp, err := dialClaims(st, claims)
	if err == nil {
		ws.Close()
		t.Fatalf("claims %q: the relay let the agent in", claims)
	}
	if resp == nil {
		t.Fatalf("claims %q: %v", claims, err)
	}
	return resp.StatusCode, handshakeAnswer(resp)
}

// handshakeAnswer is the body of the relay's answer to a refused upgrade.
func handshakeAnswer(resp *http.Response) string {
	if resp == nil {
		return "no answer"
	}
	return readAll(resp)
}

// readLoop takes the relay's frames until the connection ends. Only it
// writes to the websocket (gorilla allows one writer).
func (p *claimPeer) readLoop() {
	defer close(p.done)
	for {
		_, b, err := p.ws.ReadMessage()
		if err != nil {
			return
		}
		switch b[0] {
		case wire.FrameRequest:
			if p.answer(b) != nil {
				return
			}
		case wire.FrameGoAway:
			if g, err := wire.DecodeGoAway(b); err == nil {
				p.mu.Lock()
				p.goaway = append(p.goaway, g)
				p.mu.Unlock()
			}
		}
	}
}

// answer records a request, says it is saved, and answers a live one.
func (p *claimPeer) answer(b []byte) error {
	r, err := wire.DecodeRequest(b)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.got = append(p.got, r)
	p.mu.Unlock()
	if err := p.ws.WriteMessage(websocket.BinaryMessage, wire.AppendAck(nil, wire.Ack{Stream: r.Stream})); err != nil || r.Queued {
		return err
	}
	resp := &wire.Response{Stream: r.Stream, Status: http.StatusOK}
	return p.ws.WriteMessage(websocket.BinaryMessage, append(wire.AppendResponseHead(nil, resp), p.name...))
}

// close ends the connection, as an agent that is killed, and waits for
// the read loop.
func (p *claimPeer) close() {
	p.ws.Close()
	<-p.done
}

// bodies are the bodies of the requests p was given, in order.
func (p *claimPeer) bodies() []string { return p.collect(func(*wire.Request) bool { return true }) }

// queued are the bodies of the requests p was given from its queue.
func (p *claimPeer) queued() []string {
	return p.collect(func(r *wire.Request) bool { return r.Queued })
}

// collect returns the bodies of the requests p was given that keep
// reports true for, in order.
func (p *claimPeer) collect(keep func(*wire.Request) bool) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, r := range p.got {
		if keep(r) {
			out = append(out, string(r.Body))
		}
	}
	return out
}

// sentAway waits for the relay's goaway and returns its reason.
func (p *claimPeer) sentAway(t *testing.T) wire.GoAwayReason {
	t.Helper()
	var reason wire.GoAwayReason
	polltest.Until(t, 10*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.goaway) == 0 {
			return false
		}
		reason = p.goaway[0].Reason
		return true
	}, p.name+" was not sent away")
	return reason
}

// seatOf names the seat of claims on st's token, as the relay does.
func seatOf(t *testing.T, st *stacktest.Stack, claims ...string) string {
	t.Helper()
	set, err := claim.ParseSet(claims)
	if err != nil {
		t.Fatal(err)
	}
	return st.TunnelID + "-" + set.Key()
}

// claimant returns the registry's record of seat; nil if none.
func claimant(t *testing.T, st *stacktest.Stack, seat string) *relaystate.Claimant {
	t.Helper()
	recs, err := st.RelayDB.Claimants(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Seat == seat {
			return r
		}
	}
	return nil
}

// waitAway waits until the registry says seat's agent is away: the relay
// has taken it off its seat, and queues for it.
func waitAway(t *testing.T, st *stacktest.Stack, seat string) {
	t.Helper()
	polltest.Until(t, 10*time.Second, func() bool {
		c := claimant(t, st, seat)
		return c != nil && !c.Connected
	}, "the relay did not mark seat "+seat+" away")
}

// event is a webhook of call callID ("": none) whose developer variable
// is developer ("": none).
func event(n int, callID, developer string) string {
	call := map[string]any{}
	if callID != "" {
		call["call_id"] = callID
	}
	if developer != "" {
		call["variables"] = map[string]string{"developer": developer}
	}
	return fmt.Sprintf(`{"event":"e%d","call":%s}`, n, mustJSON(call))
}

// sendAll posts each body in turn and returns each answer's status and
// body.
func sendAll(t *testing.T, url string, bodies ...string) (statuses []int, answers []string) {
	t.Helper()
	for _, b := range bodies {
		resp, body := post(t, url, b)
		statuses = append(statuses, resp.StatusCode)
		answers = append(answers, body)
	}
	return statuses, answers
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// envelope reads an error envelope's code and message.
func envelope(t *testing.T, body string) (code, message string) {
	t.Helper()
	var env struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &env); err != nil || env.Error.Code == "" {
		t.Fatalf("not an error envelope: %s", body)
	}
	return env.Error.Code, env.Error.Message
}

// ask posts body to st's tunnel and returns the answer's status and body.
func ask(t *testing.T, st *stacktest.Stack, body string) (int, string) {
	t.Helper()
	return postHeader(t, st.TunnelURL, body, "", "")
}

// postHeader posts body to url with one more header, unless value is "".
func postHeader(t *testing.T, url, body, name, value string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if value != "" {
		req.Header.Set(name, value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, readAll(resp)
}
