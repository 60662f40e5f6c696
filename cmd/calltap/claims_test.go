package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/polltest"
)

// claimsJSON runs calltap relay claims --json on dir and returns its seats.
func claimsJSON(t *testing.T, dir string) claim.Listing {
	t.Helper()
	code, stdout, stderr := runCmd(t, "relay", "claims", "--json", "--data", dir)
	if code != 0 {
		t.Fatalf("relay claims: exit %d: %s", code, stderr)
	}
	var l claim.Listing
	if err := json.Unmarshal([]byte(stdout), &l); err != nil {
		t.Fatalf("relay claims --json: %v: %q", err, stdout)
	}
	return l
}

// seatOf returns the listed seat of token tunnelID with claims, or nil.
func seatOf(l claim.Listing, claims string) *claim.SeatRow {
	for i := range l {
		if strings.Join(l[i].Claims, " ") == claims {
			return &l[i]
		}
	}
	return nil
}

// listenAgent runs calltap listen in this process until the test ends;
// its exit code comes on the channel.
func listenAgent(t *testing.T, st *stacktest.Stack, forwardTo string, extra ...string) (out, errb *syncBuffer, done chan int, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	out, errb, done = &syncBuffer{}, &syncBuffer{}, make(chan int, 1)
	args := append([]string{"listen", "--relay", st.RelayURL, "--token", st.Token, "--forward-to", forwardTo, "--inspect", "", "--quiet", "--data", filepath.Join(t.TempDir(), "data")}, extra...)
	go func() { done <- run(ctx, args, Stdio{In: strings.NewReader(""), Out: out, Err: errb}) }()
	stop = func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("listen: exit %d: %s", code, errb.String())
		}
	}
	t.Cleanup(cancel)
	return out, errb, done, stop
}

// One token, an agent claiming alice's calls: its startup line says what
// it claims and what the relay holds for it; a second agent with the same
// claim is refused on one line (exit 1); relay claims lists the seat,
// connected, then away with the requests queued for it, and release
// removes it with them, by its id or by its token and claims, from the
// relay's SQLite data directory.
func TestClaimsOnTheCommandLine(t *testing.T) {
	h := &counter{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL, NoAgent: true, TokenName: "team"})
	const alice = "call.variables.developer=alice"
	body := func(call string) string {
		return `{"event":"call.started","call":{"call_id":"` + call + `","variables":{"developer":"alice"}}}`
	}

	out, _, _, stop := listenAgent(t, st, hs.URL, "--claim", alice)
	polltest.Until(t, 20*time.Second, func() bool { return strings.Contains(out.String(), "Claims ") }, "listen printed no claims line")
	if !strings.Contains(out.String(), "  Claims     "+alice+"; nothing queued for them") {
		t.Errorf("startup lines:\n%s", out.String())
	}
	_, errb, done, _ := listenAgent(t, st, hs.URL, "--claim", "header:x-dev=alice", "--claim", alice)
	select {
	case code := <-done:
		if msg := errb.String(); code != 1 || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "is held by another agent of token team") {
			t.Errorf("a second agent claiming %s: exit %d, %q; want exit 1 and the relay's reason on one line", alice, code, msg)
		}
	case <-time.After(time.Minute):
		t.Fatal("a second agent with a claim already held did not stop")
	}

	seat := seatOf(claimsJSON(t, st.Dir), alice)
	if seat == nil || seat.Agent != claim.AgentConnected || seat.Token != "team" || seat.TunnelID != st.TunnelID {
		t.Fatalf("relay claims lists alice's seat as %+v, want team's, connected", seat)
	}
	stop()
	for _, call := range []string{"c1", "c2"} {
		if code := postStatus(st.TunnelURL, body(call)); code != http.StatusAccepted {
			t.Fatalf("alice's call while she is away: %d, want 202", code)
		}
	}
	// The relay marks the seat away once the agent's connection is gone.
	var l claim.Listing
	polltest.Until(t, 20*time.Second, func() bool {
		l = claimsJSON(t, st.Dir)
		s := seatOf(l, alice)
		return s != nil && s.Agent == claim.AgentAway
	}, "relay claims does not list alice's seat away")
	if s := seatOf(l, alice); s.AwaySince == nil || s.Queued != 2 || s.Calls != 2 {
		t.Errorf("alice away: %+v, want away since a time, 2 queued, 2 calls", s)
	}
	if def := seatOf(l, ""); def == nil || def.Seat != st.TunnelID {
		t.Errorf("the token's default seat is not listed: %+v", l)
	}
	code, table, _ := runCmd(t, "relay", "claims", "--data", st.Dir)
	if code != 0 || !strings.Contains(table, "away since") || !strings.Contains(table, seat.Seat) {
		t.Errorf("relay claims: exit %d\n%s", code, table)
	}

	out, _, _, stop = listenAgent(t, st, hs.URL, "--claim", alice)
	polltest.Until(t, 20*time.Second, func() bool { return len(h.get()) == 2 }, "alice's queued calls did not reach her handler")
	if !strings.Contains(out.String(), "  Claims     "+alice+"; the relay holds 2 requests queued for them") {
		t.Errorf("startup lines of a returning claimant:\n%s", out.String())
	}
	stop()
	if code := postStatus(st.TunnelURL, body("c3")); code != http.StatusAccepted {
		t.Fatalf("alice's call while she is away again: %d", code)
	}
	code, stdout, stderr := runCmd(t, "relay", "claims", "release", "--token", "team", "--claim", alice, "--data", st.Dir)
	if code != 0 || !strings.Contains(stdout, "Released seat "+seat.Seat+"; 1 queued requests went with it") {
		t.Errorf("release by token and claims: exit %d, %q %q", code, stdout, stderr)
	}
	if s := seatOf(claimsJSON(t, st.Dir), alice); s != nil {
		t.Errorf("a released seat is still listed: %+v", s)
	}
	code, stdout, stderr = runCmd(t, "relay", "claims", "release", seat.Seat, "--data", st.Dir)
	if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "no agent claims calls at seat "+seat.Seat) {
		t.Errorf("releasing an unknown seat: exit %d, %q %q; want exit 1 and one line", code, stdout, stderr)
	}
}
