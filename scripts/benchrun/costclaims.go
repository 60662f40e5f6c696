package main

import (
	"fmt"
	"strings"
)

// The cost part's claims mode (benchrun cost --claims-ab): what claims
// cost the relay per request. The same build runs two relay+agent pairs,
// one agent with no claim and one with ten, whose last takes every
// request of the load, so that the relay reads each body and tries it
// against all ten; they are measured as the baseline A/B measures two
// builds, in interleaved rounds. Issue 41 holds the relay's CPU and system
// calls per request with ten claims within +15% of none, at c=1 and c=32.
// The load's requests all carry one call_id: the relay remembers the call
// once (a write to its store), and each later request finds its seat in
// the relay's cache of calls after reading the body; a call's first event
// costs the one write more.

// claimCount is how many claims the side with claims registers.
const claimCount = 10

// claimsArgs are that side's agent flags: nine claims the load misses,
// on the paths a team would claim by, then the one it matches.
func claimsArgs() []string {
	var args []string
	for i := range claimCount - 1 {
		var c string
		switch i % 3 {
		case 0:
			c = fmt.Sprintf("call.variables.developer=dev%d", i)
		case 1:
			c = fmt.Sprintf("call.to_number=+1555000%04d", i)
		default:
			c = fmt.Sprintf("header:X-Developer=dev%d", i)
		}
		args = append(args, "--claim", c)
	}
	return append(args, "--claim", "call.variables.lead_id=L-1001")
}

// claimsSide is the side of a claims A/B run with claims, for build bin,
// and the form of its table over the side with none: the relay is held to
// +15%; the agent and the handler, whose work is the same on both sides,
// are the controls.
func claimsSide(bin string) (abSide, abForm) {
	name := fmt.Sprintf("%d claims", claimCount)
	args := claimsArgs()
	var shown []string
	for i := 1; i < len(args); i += 2 {
		shown = append(shown, args[i])
	}
	return abSide{name: name, bin: bin, args: args}, abForm{
		table: "Cost per 2 KB request: " + name + " ÷ none", before: "none", after: name, held: []string{"relay"}, limit: 1.15, side: "side",
		sides: fmt.Sprintf("None: %s's agent with no claim; %s: the same build's agent with --claim %s (the last matches every request of the load).", bin, name, strings.Join(shown, " ")),
		met: "Met: the relay's CPU and system calls both within +15% (issue 41). The agent and the handler do the same work on both sides: " +
			"their rows are the controls, their ratio the machine's noise. The load's requests all carry one call_id: the relay " +
			"remembers the call once, then finds each request's seat in its cache after reading the body.",
	}
}
