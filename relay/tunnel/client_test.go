package tunnel

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// fakeRelay answers agents' handshakes as a relay of a given age would: it
// records the claims each handshake carried, then refuses it (status
// other than 0) or sends hello and a request.
type fakeRelay struct {
	status int        // a refusal's status; 0 to let the agent in
	hello  wire.Hello // sent once in

	mu         sync.Mutex
	handshakes [][]string // guarded by mu: each handshake's claims
}

func (f *fakeRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.handshakes = append(f.handshakes, r.Header.Values(wire.ClaimHeader))
	f.mu.Unlock()
	if f.status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		w.Write([]byte(`{"code":"claim_conflict","message":"the claim x=1 is held by another agent of token team:\nrelease it"}`))
		return
	}
	up := websocket.Upgrader{Subprotocols: []string{wire.Subprotocol}}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	ws.WriteMessage(websocket.BinaryMessage, wire.AppendHello(nil, &f.hello))
	req := &wire.Request{Stream: 1, ID: "r1", Method: "POST", URI: "/", Body: []byte("{}")}
	ws.WriteMessage(websocket.BinaryMessage, append(wire.AppendRequestHead(nil, req), req.Body...))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			return
		}
	}
}

func (f *fakeRelay) seen() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.handshakes)
}

// countingHandler counts the requests handed to it.
type countingHandler struct{ n atomic.Int32 }

func (h *countingHandler) ServeTunnel(req *wire.Request, s *Stream) { h.n.Add(1); s.Release() }

func claimSet(t *testing.T, exprs ...string) claim.Set {
	t.Helper()
	s, err := claim.ParseSet(exprs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runAgainst runs a client with claims against f until it ends, or fails
// the test after a minute.
func runAgainst(t *testing.T, f *fakeRelay, claims claim.Set, h Handler) (string, error) {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	var connected atomic.Bool
	c, err := NewClient(Config{RelayURL: srv.URL, Token: "ct_x", Claims: claims, Handler: h,
		OnState: func(s ConnState) { connected.Store(connected.Load() || s.State == StateConnected) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Run(ctx)
	if ctx.Err() != nil {
		t.Fatal("the client did not stop")
	}
	if connected.Load() {
		t.Error("the client said it was connected")
	}
	return srv.URL, err
}

// An agent with claims on a relay that does not know them (its hello
// holds none) would get the default agent's calls: it stops at the hello,
// saying so on one line, and takes no request.
func TestClaimsOnARelayThatDoesNotKnowThem(t *testing.T) {
	f := &fakeRelay{hello: wire.Hello{TunnelID: "t1", PublicURL: "http://x/t/t1"}}
	h := &countingHandler{}
	url, err := runAgainst(t, f, claimSet(t, "header:x-dev=alice", "call.variables.developer=alice"), h)
	if !errors.Is(err, ErrClaimsUnknown) {
		t.Fatalf("Run = %v, want ErrClaimsUnknown", err)
	}
	want := "the relay at " + url + " does not know claims (calltap relay older than this agent); upgrade it"
	if err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if n := h.n.Load(); n != 0 {
		t.Errorf("the handler took %d requests", n)
	}
	got := f.seen()
	wantClaims := []string{"call.variables.developer=alice", "header:X-Dev=alice"}
	if len(got) != 1 || !slices.Equal(got[0], wantClaims) {
		t.Errorf("handshakes carried %q, want one with %q (canonical, sorted)", got, wantClaims)
	}
}

// A relay's 409 (a claim another agent holds, or the token's claim limit)
// ends Run at once with the relay's message on one line: asking again
// would be told the same.
func TestClaimRefusalEndsTheAgent(t *testing.T) {
	f := &fakeRelay{status: http.StatusConflict}
	_, err := runAgainst(t, f, claimSet(t, "x=1"), &countingHandler{})
	if !errors.Is(err, ErrClaimRefused) {
		t.Fatalf("Run = %v, want ErrClaimRefused", err)
	}
	if want := "the claim x=1 is held by another agent of token team: release it"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if n := len(f.seen()); n != 1 {
		t.Errorf("%d handshakes, want 1: no reconnect after a refusal", n)
	}
}

// An agent with no claims sends none, and a relay's hello without claims
// is the default agent's, as before claims.
func TestNoClaimsNoHeader(t *testing.T) {
	f := &fakeRelay{hello: wire.Hello{TunnelID: "t1"}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	h := &countingHandler{}
	c, err := NewClient(Config{RelayURL: srv.URL, Token: "ct_x", Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	polltest.Until(t, time.Minute, func() bool { return h.n.Load() > 0 }, "the default agent took no request")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	for _, claims := range f.seen() {
		if len(claims) != 0 {
			t.Errorf("a handshake carried claims %q", strings.Join(claims, ", "))
		}
	}
}
