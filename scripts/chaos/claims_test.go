package main

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/claim"
)

// TestClaimsMatchTheTraffic: each claimant's --claim is one the relay
// reads, and it claims the call.started of its developer's calls only, as
// the checker expects: no other developer's, nor a later event naming
// nobody (which must follow its call all the same).
func TestClaimsMatchTheTraffic(t *testing.T) {
	cs := chaosClaimants(true)
	if len(cs) != 3 || len(chaosClaimants(false)) != 0 {
		t.Fatalf("with claims %d claimants, without %d; want 3 and none", len(cs), len(chaosClaimants(false)))
	}
	noHeader := http.Header{}
	for _, c := range cs {
		cl, err := claim.Parse(claimFlag(c))
		if err != nil {
			t.Fatalf("%s's claim %q: %v", c.Name, claimFlag(c), err)
		}
		for _, dev := range append(trafficMix(true).developers, "") {
			events := callEvents(callevent.CallSpec{Start: time.Now()}, dev)
			for i, p := range events {
				body, err := json.Marshal(p)
				if err != nil {
					t.Fatal(err)
				}
				want := i == 0 && dev == c.Developer
				if got := cl.Matches(claim.NewRequest(body, noHeader.Get)); got != want {
					t.Errorf("%s's claim matches the %s of a call of developer %q: %v, want %v", c.Name, p.Event, dev, got, want)
				}
			}
		}
	}
	if routeDeveloper(true) == cs[0].Developer {
		t.Error("the default agent's route names a claimed developer: it would get no call")
	}
}

// TestTeamMix: with claims, the calls are for every claimant, the
// developer nobody claims, and nobody; some later events name a developer
// of their own; without claims none does.
func TestTeamMix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	started, strays := map[string]int{}, 0
	for range 600 {
		events := trafficMix(true).events(rng, callevent.CallSpec{Start: time.Now()})
		dev, _ := events[0].Call.Variables["developer"].(string)
		started[dev]++
		for _, p := range events[1:] {
			if _, ok := p.Call.Variables["developer"]; ok {
				strays++
			}
		}
	}
	for _, dev := range []string{"alice", "bob", "carol", "dave", ""} {
		if started[dev] < 50 {
			t.Errorf("%d calls of 600 for developer %q", started[dev], dev)
		}
	}
	if strays == 0 {
		t.Error("no later event names a developer")
	}
	single := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		for _, p := range trafficMix(false).events(single, callevent.CallSpec{Start: time.Now()})[1:] {
			if _, ok := p.Call.Variables["developer"]; ok {
				t.Fatalf("without claims: a later event (%s) names a developer", p.Event)
			}
		}
	}
}

// TestClaimsFlag: claims are on in team mode and off in single mode unless
// -claims says otherwise.
func TestClaimsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"-single"}, false},
		{[]string{"-single", "-claims"}, true},
		{[]string{"-claims=false"}, false},
	} {
		cfg, err := parseArgs(append([]string{"-seed", "1"}, tc.args...))
		if err != nil || cfg.claims != tc.want {
			t.Errorf("chaos %v: claims %v (%v), want %v", tc.args, cfg.claims, err, tc.want)
		}
	}
}
