package main

import (
	"maps"
	"math/rand/v2"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/scripts/chaos/history"
)

// chaosClaimants are, with claims on (team mode's default), the agents
// that share the token with the default one (issue 41), each claiming the
// calls whose call.variables.developer names it. Without, one agent.
func chaosClaimants(on bool) []history.Claimant {
	if !on {
		return nil
	}
	return []history.Claimant{{Name: "alice", Developer: "alice"}, {Name: "bob", Developer: "bob"}, {Name: "carol", Developer: "carol"}}
}

// claimFlag is the --claim a claimant's agent runs with.
func claimFlag(c history.Claimant) string { return "call.variables.developer=" + c.Developer }

// routeDeveloper is the developer the default agent's route file names:
// one whose calls reach the default agent, so that the route has calls to
// take. With claims that is dave, whom nobody claims.
func routeDeveloper(claims bool) string {
	if claims {
		return "dave"
	}
	return "alice"
}

// mix is whom the senders' calls are for.
type mix struct {
	// developers are drawn from, evenly, for each call's call.started; ""
	// names nobody.
	developers []string
	// strays: a later event of a call now and then names a developer too,
	// another one as often as not, which the call must not follow.
	strays bool
}

// trafficMix is the run's mix. One agent: alice for a third of the calls
// (her route takes them), bob for a sixth (no route of his: the default
// takes them), nobody for the rest. With claims: a sixth each for the
// three claimants and for dave (the default agent's route), nobody for a
// third; and strays.
func trafficMix(claims bool) mix {
	if claims {
		return mix{developers: []string{"alice", "bob", "carol", "dave", "", ""}, strays: true}
	}
	return mix{developers: []string{"alice", "alice", "bob", "", "", ""}}
}

// strayOneIn is how rarely a later event of a call names a developer.
const strayOneIn = 8

// events are the events of a new call: its developer drawn from m's, and,
// with strays, some of its later events (never the call.started) naming
// one of them too.
func (m mix) events(rng *rand.Rand, spec callevent.CallSpec) []callevent.Payload {
	events := callEvents(spec, m.developers[rng.IntN(len(m.developers))])
	if !m.strays {
		return events
	}
	for i := 1; i < len(events); i++ {
		if rng.IntN(strayOneIn) != 0 {
			continue
		}
		if dev := m.developers[rng.IntN(len(m.developers))]; dev != "" {
			vars := maps.Clone(events[i].Call.Variables)
			if vars == nil {
				vars = map[string]any{}
			}
			vars["developer"] = dev
			events[i].Call.Variables = vars
		}
	}
	return events
}

// callEvents are spec's events, the call.started naming developer dev in
// its variables (none for ""). Only call.started names the developer: the
// call's later events must follow it to its route (and its claimant) all
// the same.
func callEvents(spec callevent.CallSpec, dev string) []callevent.Payload {
	events := spec.Events()
	if dev != "" {
		vars := maps.Clone(events[0].Call.Variables)
		vars["developer"] = dev
		events[0].Call.Variables = vars
	}
	return events
}
