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
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/relaystate"
	"github.com/prometheus/common/expfmt"
)

const (
	aliceClaim = "call.variables.developer=alice"
	bobClaim   = "call.variables.developer=bob"
)

// Three agents on one token: alice and bob by call.variables.developer,
// and the default. A call's events go where its first event went,
// whatever the later ones carry; a request that names no call goes by its
// claims alone; what no claim matches (a body that is not JSON, or lacks
// the path) is the default's. Each sender gets the answer of the agent
// that took its request, and no agent is given another's.
func TestClaimsGiveEachCallToItsClaimant(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	def := dialPeer(t, st, "default")
	alice := dialPeer(t, st, "alice", aliceClaim)
	bob := dialPeer(t, st, "bob", bobClaim, "header:x-developer=bob")
	if !slices.Equal(alice.hello.Claims, []string{aliceClaim}) || !slices.Equal(bob.hello.Claims, []string{bobClaim, "header:X-Developer=bob"}) || def.hello.Claims != nil {
		t.Fatalf("the hellos hold the seats by %q, %q and %q", alice.hello.Claims, bob.hello.Claims, def.hello.Claims)
	}
	steps := []struct {
		body, header, want string
	}{
		{event(1, "c1", "alice"), "", "alice"}, // a call's first event: its claimant's
		{event(2, "c1", ""), "", "alice"},      // later events follow it, without the field
		{event(3, "c1", "bob"), "", "alice"},   // or naming someone else
		{event(4, "c2", "bob"), "", "bob"},
		{event(5, "c2", ""), "", "bob"},
		{event(6, "c3", ""), "", "default"}, // a call nobody claimed is the default's
		{event(7, "c3", "alice"), "", "default"},
		{event(8, "", "bob"), "", "bob"}, // no call: by its claims alone
		{event(9, "", "alice"), "", "alice"},
		{event(10, "", ""), "", "default"},
		{event(11, "c4", ""), "bob", "bob"}, // a header claim
		{event(12, "c4", "alice"), "", "bob"},
		{`{"call":{"call_id":"c5","variables":{"developer":"alice"}}`, "", "default"}, // not JSON
		{`developer=alice`, "", "default"},
		{`{"call":{"call_id":"c6","variables":{}}}`, "", "default"}, // lacks the path
		{`{"call":{"call_id":"c6","variables":{"developer":"alice"}}}`, "", "default"},
		{`{"call":{"variables":{"developer":{"name":"alice"}}}}`, "", "default"}, // an object, not the value
	}
	want := map[string][]string{}
	for i, s := range steps {
		status, answer := postHeader(t, st.TunnelURL+"/hook", s.body, "X-Developer", s.header)
		if status != http.StatusOK || answer != s.want {
			t.Fatalf("step %d (%s, header %q): %d %q, want the answer of %s", i+1, s.body, s.header, status, answer, s.want)
		}
		want[s.want] = append(want[s.want], s.body)
	}
	for _, p := range []*claimPeer{def, alice, bob} {
		if got := p.bodies(); !slices.Equal(got, want[p.name]) {
			t.Errorf("%s was given\n%s\nwant\n%s", p.name, strings.Join(got, "\n"), strings.Join(want[p.name], "\n"))
		}
	}
}

// A claim another seat of the token holds is refused before the upgrade,
// 409, saying which claim and which seat; the same claim set (in any
// order) takes its seat over, as a second agent takes a token today; and
// a token's claims are bounded by Config.MaxClaims.
func TestClaimConflictsAndTakeover(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true, Relay: func(c *relay.Config) { c.MaxClaims = 3 }})
	alice := dialPeer(t, st, "alice", aliceClaim)
	seat := seatOf(t, st, aliceClaim)

	status, body := refusedDial(t, st, "call.variables.developer=carol", aliceClaim)
	code, msg := envelope(t, body)
	if status != http.StatusConflict || code != api.CodeClaimConflict || !strings.Contains(msg, aliceClaim) || !strings.Contains(msg, seat) {
		t.Fatalf("a shared claim: %d %s %q, want 409 naming %s and seat %s", status, code, msg, aliceClaim, seat)
	}

	alice2 := dialPeer(t, st, "alice2", aliceClaim, aliceClaim)
	if r := alice.sentAway(t); r != wire.GoAwayReplaced {
		t.Fatalf("the agent taken over from was sent away with reason %d, want GoAwayReplaced", r)
	}
	if status, answer := ask(t, st, event(1, "c1", "alice")); status != http.StatusOK || answer != "alice2" {
		t.Fatalf("after the takeover alice's call got %d %q", status, answer)
	}

	// alice holds 1 claim: 3 more take the token past 3.
	status, body = refusedDial(t, st, "header:X-Team=a", "header:X-Team=b", "header:X-Team=c")
	code, msg = envelope(t, body)
	if status != http.StatusConflict || code != api.CodeClaimConflict || !strings.Contains(msg, "at most 3") {
		t.Fatalf("over the limit: %d %s %q, want 409 saying the limit", status, code, msg)
	}
	dialPeer(t, st, "team", "header:X-Team=a", "header:X-Team=b") // up to it: let in
	if len(alice2.bodies()) != 1 {
		t.Errorf("alice2 was given %q", alice2.bodies())
	}
}

// A claimant who is away keeps its calls: they are answered 202, queued
// for its seat, never given to the default, and delivered in order when
// it comes back. Its seat, the calls it holds and its queue are in the
// relay's database, so this holds across a relay restart too.
func TestAwayClaimantKeepsItsCalls(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true, TokenName: "team"})
	def := dialPeer(t, st, "default")
	alice := dialPeer(t, st, "alice", aliceClaim)
	seat := seatOf(t, st, aliceClaim)
	if status, answer := ask(t, st, event(0, "c1", "alice")); status != http.StatusOK || answer != "alice" {
		t.Fatalf("alice's call: %d %q", status, answer)
	}
	alice.close()
	waitAway(t, st, seat)

	before := []string{event(1, "c1", ""), event(2, "c2", "alice"), event(3, "c1", "bob"), event(4, "c2", ""), event(5, "", "alice")}
	queuedForAlice(t, st, before)
	if status, answer := ask(t, st, event(6, "c3", "")); status != http.StatusOK || answer != "default" {
		t.Fatalf("an unclaimed call while alice is away: %d %q", status, answer)
	}

	st.StopRelay()
	st.StartRelay()
	def2 := dialPeer(t, st, "default")
	after := []string{event(7, "c1", ""), event(8, "c2", "bob")} // known from the database alone
	queuedForAlice(t, st, after)
	if status, answer := ask(t, st, event(9, "c3", "alice")); status != http.StatusOK || answer != "default" {
		t.Fatalf("the default's call after the restart: %d %q", status, answer)
	}

	back := dialPeer(t, st, "alice", aliceClaim)
	want := append(before, after...)
	if back.hello.Queued != len(want) || back.hello.Name != "team" {
		t.Errorf("alice's hello says %d queued on token %q, want %d on team", back.hello.Queued, back.hello.Name, len(want))
	}
	polltest.Until(t, 10*time.Second, func() bool { return len(back.bodies()) >= len(want) }, "alice was not given her queue")
	if got := back.queued(); !slices.Equal(got, want) {
		t.Fatalf("alice was given\n%s\nwant, in order\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := append(def.bodies(), def2.bodies()...); !slices.Equal(got, []string{event(6, "c3", ""), event(9, "c3", "alice")}) {
		t.Errorf("the default was given %q", got)
	}
}

// queuedForAlice sends bodies, each of which the relay must queue (202).
func queuedForAlice(t *testing.T, st *stacktest.Stack, bodies []string) {
	t.Helper()
	statuses, answers := sendAll(t, st.TunnelURL+"/hook", bodies...)
	for i, s := range statuses {
		queuedID(t, &http.Response{StatusCode: s}, answers[i])
	}
}

// Unclaimed calls with no default agent connected queue for the default,
// not for a claimant, and reach the default, in order, when it connects.
func TestUnclaimedCallsQueueForAnAbsentDefault(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	alice := dialPeer(t, st, "alice", aliceClaim)
	unclaimed := []string{event(1, "c1", ""), event(2, "", ""), `not json`, event(3, "c1", "alice")}
	queuedForAlice(t, st, unclaimed)
	if status, answer := ask(t, st, event(4, "c2", "alice")); status != http.StatusOK || answer != "alice" {
		t.Fatalf("alice's call: %d %q", status, answer)
	}
	def := dialPeer(t, st, "default")
	polltest.Until(t, 10*time.Second, func() bool { return len(def.bodies()) >= len(unclaimed) }, "the default was not given its queue")
	if got := def.queued(); !slices.Equal(got, unclaimed) {
		t.Fatalf("the default was given %q, want %q", got, unclaimed)
	}
	if got := alice.bodies(); !slices.Equal(got, []string{event(4, "c2", "alice")}) {
		t.Errorf("alice was given %q", got)
	}
}

// Seats are the relay's to choose: a sender naming one in its URL, a
// registered one or not, finds no tunnel there.
func TestSeatIDInURLIsNotFound(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	alice := dialPeer(t, st, "alice", aliceClaim)
	for _, id := range []string{seatOf(t, st, aliceClaim), st.TunnelID + "-0123456789abcdef"} {
		resp, body := post(t, st.RelayURL+"/t/"+id+"/hook", event(1, "c1", "alice"))
		if resp.StatusCode != http.StatusNotFound || errorCode(t, body) != api.CodeNotFound {
			t.Errorf("/t/%s: %d %s, want 404", id, resp.StatusCode, body)
		}
	}
	if got := alice.bodies(); len(got) != 0 {
		t.Errorf("alice was given %q", got)
	}
	stats, err := st.RelayDB.QueueStatsByTunnel(context.Background())
	if err != nil || len(stats) != 0 {
		t.Errorf("the relay queued %v (%v)", stats, err)
	}
}

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
	// carol's record as a relay killed under her agent leaves it.
	if err := st.RelayDB.SaveClaimant(ctx, &relaystate.Claimant{TunnelID: st.TunnelID, Seat: carolSeat, Claims: []string{carol},
		CreatedAt: longAgo.Add(-time.Hour), SeenAt: longAgo, Connected: true}); err != nil {
		t.Fatal(err)
	}
	st.StartRelay()

	dialPeer(t, st, "bob", bobClaim)
	bobSeat := seatOf(t, st, bobClaim)
	markAway(t, st, bobSeat, longAgo) // as the run it took over from would
	alice := dialPeer(t, st, "alice", aliceClaim)
	aliceSeat := seatOf(t, st, aliceClaim)
	alice.close()
	waitAway(t, st, aliceSeat)
	markAway(t, st, aliceSeat, longAgo)

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

// markAway rewrites the registry's record of seat: away since seen.
func markAway(t *testing.T, st *stacktest.Stack, seat string, seen time.Time) {
	t.Helper()
	c := claimant(t, st, seat)
	if c == nil {
		t.Fatalf("seat %s is not registered", seat)
	}
	c.Connected, c.SeenAt = false, seen
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

// /metrics counts each seat's deliveries and queue in valid Prometheus
// text: each family's samples together under its TYPE, and label values
// escaped as the format escapes them, whatever text a claim holds (Go's
// %q would write \u00a0, which no scraper reads, and the whole page would
// fail to scrape).
func TestClaimMetrics(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{NoAgent: true})
	dialPeer(t, st, "default")
	dialPeer(t, st, "alice", aliceClaim)
	odd := "call.variables.developer=zoë\u00a0\u200b\"x\\"
	dialPeer(t, st, "odd", odd)
	bob := dialPeer(t, st, "bob", bobClaim)
	bob.close()
	waitAway(t, st, seatOf(t, st, bobClaim))
	for _, body := range []string{event(1, "c1", "alice"), event(2, "c1", ""), event(3, "c2", "")} {
		if status, answer := ask(t, st, body); status != http.StatusOK {
			t.Fatalf("%s: %d %s", body, status, answer)
		}
	}
	queuedForAlice(t, st, []string{event(4, "c3", "bob"), event(5, "c3", "")})

	text := metrics(t, st)
	familiesGrouped(t, text)
	fams, err := new(expfmt.TextParser).TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text: %v\n%s", err, text)
	}
	seats := map[string]string{st.TunnelID: "", seatOf(t, st, aliceClaim): aliceClaim, seatOf(t, st, bobClaim): bobClaim, seatOf(t, st, odd): odd}
	wantDelivered := map[string]float64{st.TunnelID: 1, seatOf(t, st, aliceClaim): 2}
	wantQueued := map[string]float64{seatOf(t, st, bobClaim): 2}
	for name, want := range map[string]map[string]float64{"calltap_claim_deliveries_total": wantDelivered, "calltap_claim_queue_depth": wantQueued} {
		got := map[string]float64{}
		for _, m := range fams[name].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			seat := labels["seat"]
			if claims, ok := seats[seat]; !ok || labels["claims"] != claims || labels["token"] != "alice" {
				t.Errorf("%s: unexpected labels %v", name, labels)
			}
			got[seat] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		if len(got) != len(seats) {
			t.Errorf("%s has %d seats, want %d:\n%s", name, len(got), len(seats), text)
		}
		for seat := range seats {
			if got[seat] != want[seat] {
				t.Errorf("%s{seat=%q} = %v, want %v", name, seat, got[seat], want[seat])
			}
		}
	}
}

// familiesGrouped checks that each family's samples follow its own TYPE
// line, one group per family, as the text format requires.
func familiesGrouped(t *testing.T, text string) {
	t.Helper()
	typed := map[string]bool{}
	current := ""
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			current, _, _ = strings.Cut(f, " ")
			if typed[current] {
				t.Errorf("family %s is typed twice", current)
			}
			typed[current] = true
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		if name := line[:strings.IndexAny(line, "{ ")]; name != current {
			t.Errorf("sample %q is not under its family's TYPE (it follows %s's)", line, current)
		}
	}
}
