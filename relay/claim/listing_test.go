package claim

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/relaystate"
)

// registry is a relay's state held in memory.
type registry struct {
	tokens    []*relaystate.Token
	claimants []*relaystate.Claimant
	queued    map[string]relaystate.QueueStats
	calls     map[string]int
	since     time.Time // what CallsSince was asked
}

func (r *registry) Tokens(context.Context) ([]*relaystate.Token, error) { return r.tokens, nil }
func (r *registry) Claimants(context.Context) ([]*relaystate.Claimant, error) {
	return r.claimants, nil
}
func (r *registry) QueueStatsByTunnel(context.Context) (map[string]relaystate.QueueStats, error) {
	return r.queued, nil
}
func (r *registry) CallsSince(_ context.Context, since time.Time) (map[string]int, error) {
	r.since = since
	return r.calls, nil
}

func TestListing(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	revoked := now.Add(-time.Hour)
	alice, bob := Set{{Path: []string{"d"}, Value: "alice"}}, Set{{Path: []string{"d"}, Value: "bob"}}
	r := &registry{
		tokens: []*relaystate.Token{
			{Name: "zeta", TunnelID: "bbb"},
			{Name: "team", TunnelID: "aaa"},
			{Name: "quiet", TunnelID: "ccc"},
			{Name: "gone", TunnelID: "ddd", RevokedAt: &revoked},
		},
		// The registry's order: the oldest seat first.
		claimants: []*relaystate.Claimant{
			{TunnelID: "aaa", Seat: SeatID("aaa", bob), Claims: bob.Strings(), Connected: true},
			{TunnelID: "aaa", Seat: SeatID("aaa", alice), Claims: alice.Strings(), SeenAt: now.Add(-3 * time.Hour)},
		},
		queued: map[string]relaystate.QueueStats{SeatID("aaa", alice): {Count: 3}, "bbb": {Count: 1}, "ddd": {Count: 5}},
		calls:  map[string]int{SeatID("aaa", alice): 2, "aaa": 4},
	}
	l, err := ReadListing(context.Background(), r, now)
	if err != nil {
		t.Fatal(err)
	}
	if !r.since.Equal(now.Add(-time.Hour)) {
		t.Errorf("calls counted since %v, want an hour before now", r.since)
	}
	// team: its default seat (it has claimants), bob, alice; zeta: its
	// default seat (a queue); quiet has neither, gone is revoked.
	want := []string{"aaa", SeatID("aaa", bob), SeatID("aaa", alice), "bbb"}
	var got []string
	for _, row := range l {
		got = append(got, row.Seat)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("seats %v, want %v", got, want)
	}
	def, b, a := l[0], l[1], l[2]
	if def.Token != "team" || def.Agent != AgentUnknown || len(def.Claims) != 0 || def.Calls != 4 || def.Queued != 0 {
		t.Errorf("team's default seat: %+v", def)
	}
	if b.Agent != AgentConnected || b.AwaySince != nil || b.Queued != 0 {
		t.Errorf("bob's seat: %+v", b)
	}
	if a.Agent != AgentAway || a.AwaySince == nil || !a.AwaySince.Equal(now.Add(-3*time.Hour)) || a.Queued != 3 || a.Calls != 2 || a.Claims[0] != "d=alice" {
		t.Errorf("alice's seat: %+v", a)
	}

	js, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	json.Unmarshal(js, &rows)
	for _, field := range []string{"token", "tunnel_id", "seat", "claims", "agent", "away_since", "queued", "calls_last_hour"} {
		if _, ok := rows[0][field]; !ok {
			t.Errorf("JSON lacks %q: %s", field, js)
		}
	}
	if rows[0]["claims"] == nil {
		t.Error("the default seat's claims are null in JSON, want []")
	}

	var table strings.Builder
	if err := l.WriteTable(&table, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TOKEN", "(default: what nobody claims)", "connected", "(3h ago)", "d=alice"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

func TestListingEmpty(t *testing.T) {
	l, err := ReadListing(context.Background(), &registry{}, time.Now())
	if err != nil || l == nil || len(l) != 0 {
		t.Fatalf("%#v, %v; want an empty, non-nil listing (JSON [])", l, err)
	}
	var table strings.Builder
	l.WriteTable(&table, time.Now())
	if !strings.HasPrefix(table.String(), "No seats") {
		t.Errorf("%q", table.String())
	}
}

func TestResolveSeat(t *testing.T) {
	revoked := time.Now()
	r := &registry{tokens: []*relaystate.Token{{Name: "old", TunnelID: "aaa", RevokedAt: &revoked}, {Name: "team", TunnelID: "bbb"}}}
	s, _ := ParseSet([]string{"x=1", "header:y=2"})
	if got, err := ResolveSeat(context.Background(), r, "team", s); err != nil || got != "bbb-"+s.Key() {
		t.Errorf("ResolveSeat = %q, %v", got, err)
	}
	for _, name := range []string{"old", "nope"} {
		if _, err := ResolveSeat(context.Background(), r, name, s); !errors.Is(err, ErrNoSuchToken) {
			t.Errorf("token %s: %v, want ErrNoSuchToken", name, err)
		}
	}
	if SeatID("bbb", nil) != "bbb" {
		t.Error("the default seat's id is not the tunnel id")
	}
}

func TestRoughly(t *testing.T) {
	for d, want := range map[time.Duration]string{-time.Second: "0s", 40 * time.Second: "40s", 12 * time.Minute: "12m", 5 * time.Hour: "5h", 47 * time.Hour: "47h", 80 * time.Hour: "3d"} {
		if got := roughly(d); got != want {
			t.Errorf("roughly(%v) = %q, want %q", d, got, want)
		}
	}
}
