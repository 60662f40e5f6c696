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
