package relay_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaystate"
)

// A seat released in the registry (calltap relay claims release) sends
// its agent away, and stays released once that agent is gone: its
// claims' calls, and the calls it held, go to the default.
func TestReleasedSeatSendsItsAgentAway(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	def := dialPeer(t, st, "default")
	alice := dialPeer(t, st, "alice", aliceClaim)
	seat := seatOf(t, st, aliceClaim)
	if status, answer := ask(t, st, event(1, "c1", "alice")); status != http.StatusOK || answer != "alice" {
		t.Fatalf("alice's call: %d %q", status, answer)
	}
	if _, err := st.RelayDB.ReleaseClaimant(context.Background(), seat); err != nil {
		t.Fatal(err)
	}
	if r := alice.sentAway(t); r != wire.GoAwayRevoked {
		t.Fatalf("alice was sent away with reason %d, want GoAwayRevoked", r)
	}
	// The relay is done with alice's agent once it counts the default's alone.
	waitMetric(t, st, "calltap_tunnels_connected 1")
	if c := claimant(t, st, seat); c != nil {
		t.Fatalf("the released seat is registered again once its agent left: %+v", c)
	}
	for _, body := range []string{event(2, "c1", ""), event(3, "c2", "alice")} {
		if status, answer := ask(t, st, body); status != http.StatusOK || answer != "default" {
			t.Fatalf("%s after the release: %d %q, want the default's answer", body, status, answer)
		}
	}
	if n := len(def.bodies()); n != 2 {
		t.Errorf("the default was given %d requests, want 2", n)
	}
}

// waitMetric waits until the relay's /metrics has the line want.
func waitMetric(t *testing.T, st *stacktest.Stack, want string) {
	t.Helper()
	polltest.Until(t, 10*time.Second, func() bool {
		return slices.Contains(strings.Split(metrics(t, st), "\n"), want)
	}, "/metrics never had "+want)
}

// metrics reads st's relay's /metrics.
func metrics(t *testing.T, st *stacktest.Stack) string {
	t.Helper()
	resp, err := http.Get(st.RelayURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return readAll(resp)
}

// A seat away longer than Config.ClaimTTL is released by the relay's
// expiry, with its queue; from then on its claims' calls are the
// default's, at once (no request is queued for a seat that is gone).
// The expiry runs every 10 s: this test waits for one run.
func TestSeatAwayLongerThanClaimTTLIsReleased(t *testing.T) {
	t.Parallel()
	st := stacktest.Start(t, stacktest.Options{NoAgent: true, Relay: func(c *relay.Config) { c.ClaimTTL = 100 * time.Millisecond }})
	def := dialPeer(t, st, "default")
	alice := dialPeer(t, st, "alice", aliceClaim)
	seat := seatOf(t, st, aliceClaim)
	alice.close()
	waitAway(t, st, seat)
	queuedForAlice(t, st, []string{event(1, "c1", "alice")})

	polltest.Until(t, 30*time.Second, func() bool { return claimant(t, st, seat) == nil }, "the seat was not released")
	if status, answer := ask(t, st, event(2, "c1", "")); status != http.StatusOK || answer != "default" {
		t.Fatalf("the released seat's call: %d %q, want the default's answer", status, answer)
	}
	stats, err := st.RelayDB.QueueStatsByTunnel(context.Background())
	if err != nil || stats[seat].Count != 0 {
		t.Errorf("the released seat's queue holds %d (%v)", stats[seat].Count, err)
	}
	if got := def.bodies(); !slices.Equal(got, []string{event(2, "c1", "")}) {
		t.Errorf("the default was given %q", got)
	}
}

// The expiry releases only seats nobody holds: not one whose agent is
// connected though its record says away (a run it took over from marks
// it so as it leaves), nor one whose agent was connected when the relay
// was killed, however long ago it connected. A seat away for two hours,
// registered after both, shows the expiry has run.
func TestClaimTTLSparesSeatsInUse(t *testing.T) {
	t.Parallel()
	st := stacktest.Start(t, stacktest.Options{NoAgent: true, Relay: func(c *relay.Config) { c.ClaimTTL = time.Hour }})
	ctx := context.Background()
	longAgo := time.Now().Add(-2 * time.Hour)
	carol := "call.variables.developer=carol"
	carolSeat := seatOf(t, st, carol)
	st.StopRelay()
	if err := st.RelayDB.SaveClaimant(ctx, &relaystate.Claimant{TunnelID: st.TunnelID, Seat: carolSeat, Claims: []string{carol},
		CreatedAt: longAgo.Add(-time.Hour), SeenAt: longAgo, Connected: true}); err != nil {
		t.Fatal(err)
	}
	st.StartRelay()

	dialPeer(t, st, "bob", bobClaim)
	bobSeat := seatOf(t, st, bobClaim)
	markSeat(t, st, bobSeat, false, longAgo)
	alice := dialPeer(t, st, "alice", aliceClaim)
	aliceSeat := seatOf(t, st, aliceClaim)
	alice.close()
	waitAway(t, st, aliceSeat)
	markSeat(t, st, aliceSeat, false, longAgo)

	polltest.Until(t, 30*time.Second, func() bool { return claimant(t, st, aliceSeat) == nil }, "the seat away for two hours was not released")
	if claimant(t, st, carolSeat) == nil {
		t.Error("a seat whose agent was connected when the relay stopped was released at the first expiry after the restart")
	}
	if claimant(t, st, bobSeat) == nil {
		t.Error("a seat whose agent is connected was released")
	}
	if status, answer := ask(t, st, event(1, "c1", "bob")); status != http.StatusOK || answer != "bob" {
		t.Fatalf("bob's call: %d %q", status, answer)
	}
}

// markSeat rewrites the registry's record of seat.
func markSeat(t *testing.T, st *stacktest.Stack, seat string, connected bool, seen time.Time) {
	t.Helper()
	c := claimant(t, st, seat)
	if c == nil {
		t.Fatalf("seat %s is not registered", seat)
	}
	c.Connected, c.SeenAt = connected, seen
	if err := st.RelayDB.SaveClaimant(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

// An agent whose upgrade fails after its claims were registered leaves
// its seat away, not connected: a seat the registry calls connected is
// never released by the claim TTL.
func TestFailedUpgradeLeavesItsSeatAway(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	req, err := http.NewRequest(http.MethodGet, st.RelayURL+wire.ConnectPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+st.Token)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Protocol", wire.Subprotocol)
	req.Header.Set(wire.ClaimHeader, aliceClaim)
	// No Sec-WebSocket-Key: the handshake is read, the upgrade refused.
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(resp); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("the upgrade without a key: %d %s", resp.StatusCode, body)
	}
	waitAway(t, st, seatOf(t, st, aliceClaim))
}
