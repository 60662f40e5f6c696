package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/polltest"
)

// A claim that does not parse, or a bad bound of the relay's claims, is a
// usage error: one line naming the flag, exit 2, and nothing started (no
// data directory made).
func TestClaimFlagErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	listen := []string{"listen", "--relay", "http://127.0.0.1:1", "--token", "t", "--forward-to", "http://127.0.0.1:3000", "--data", dir}
	dev := []string{"dev", "--forward-to", "http://127.0.0.1:3000", "--listen", "127.0.0.1:0", "--inspect", "", "--data", dir}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(listen, "--claim", "alice"), `--claim "alice": want PATH=VALUE`},
		{append(listen, "--claim", "call.variables.developer=alice", "--claim", "call..x=1"), `--claim "call..x=1"`},
		{append(listen, "--claim", "x="), "the value after = is empty"},
		{append(dev, "--claim", "header:a b=c"), `--claim "header:a b=c"`},
		{[]string{"relay", "--max-claims", "0", "--data", dir}, "--max-claims must be 1 or more"},
		{[]string{"relay", "--claim-ttl", "0", "--data", dir}, "-claim-ttl"},
		{[]string{"relay", "--claim-ttl", "-1d", "--data", dir}, "above zero"},
		{[]string{"relay", "--claim-ttl", "sevend", "--data", dir}, "a number of days"},
		{[]string{"relay", "--call-memory", "1y", "--data", dir}, "-call-memory"},
		{[]string{"relay", "claims", "extra", "--data", dir}, `unexpected argument "extra"`},
		{[]string{"relay", "claims", "release", "--data", dir}, "give a SEAT"},
		{[]string{"relay", "claims", "release", "s-1", "--token", "team", "--claim", "x=1", "--data", dir}, "not both"},
		{[]string{"relay", "claims", "release", "--token", "team", "--data", dir}, "give a SEAT"},
		{[]string{"relay", "claims", "release", "--token", "team", "--claim", "x", "--data", dir}, `--claim "x"`},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", tc.args, code, stdout, stderr, tc.want)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused command made its data directory (%v)", err)
	}
}

// --claim-ttl and --call-memory take Go's durations and days.
func TestDaysFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "36h": 36 * time.Hour, "1.5d": 36 * time.Hour, "90m": 90 * time.Minute} {
		var d days
		if err := d.Set(in); err != nil || time.Duration(d) != want {
			t.Errorf("%q: %v, %v; want %v", in, time.Duration(d), err, want)
		}
	}
	for d, want := range map[days]string{days(7 * 24 * time.Hour): "7d", days(36 * time.Hour): "36h0m0s"} {
		if got := d.String(); got != want {
			t.Errorf("%v prints %q, want %q", time.Duration(d), got, want)
		}
	}
}

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
