package main

import (
	"fmt"
	"path/filepath"
)

// The cost part's routes mode (benchrun cost --routes-ab): what a route
// file costs the agent per request. The same build runs two relay+agent
// pairs, one agent with no route file and one with a 10-route file whose
// last route takes every request of the load, so that each is tried
// against all ten; they are measured as the baseline A/B measures two
// builds, in interleaved rounds. Issue 40 holds the agent's CPU and system
// calls per request with ten routes within +10% of none, at c=1 and c=32.

// costRoutes is the cost part's 10-route file: otherRoutes, which the
// load's requests all miss, then a route that takes them (their lead, any
// call event) to the bench's handler at hurl, where --forward-to sends
// them without a route file.
func costRoutes(hurl string) string {
	return otherRoutes() + fmt.Sprintf("[[route]]\nname = \"lead1001\"\nevents = [\"call.*\"]\nmatch = { \"call.variables.lead_id\" = \"L-1001\" }\nforward-to = %q\n",
		hurl+"/webhooks")
}

// benchFileIs says what the bench's route file is, in the table's note.
const benchFileIs = "the bench's: nine routes on call.variables, custom fields with a path, event kinds with a header, which " +
	"every request misses, then a tenth that takes it to the handler, where --forward-to sends it without a file"

// routesSide is the side of a routes A/B run with a route file (file,
// else costRoutes written to pt's directory), for build bin, and the form
// of its table over the side with none.
func routesSide(pt *part, bin, file string) (abSide, abForm, error) {
	name, is := filepath.Base(file), file
	if file == "" {
		var err error
		if file, err = writeRoutesFile(pt.dir, costRoutes(pt.hurl)); err != nil {
			return abSide{}, abForm{}, err
		}
		name, is = fmt.Sprintf("%d routes", routeCount), benchFileIs
	}
	return abSide{name: name, bin: bin, args: []string{"--routes", file}}, routesForm(name, is, bin), nil
}

// routesForm is the table of the agent with a route file (name; is says
// what the file is) over the agent with none, both of build bin: the
// agent is held to +10%; the relay and the handler, the same on both
// sides, are the controls.
func routesForm(name, is, bin string) abForm {
	return abForm{table: "Cost per 2 KB request: " + name + " ÷ none", before: "none", after: name, held: []string{"agent"}, side: "side",
		sides: fmt.Sprintf("None: %s's agent with no route file; %s: the same build's agent with --routes FILE (%s).", bin, name, is),
		met: "Met: the agent's CPU and system calls both within +10% (issue 40). The relay and the handler run the same code " +
			"with the same flags on both sides: their rows are the controls, their ratio the machine's noise. The load's " +
			"requests all carry one call_id: what the agent keeps of a call to keep it together is written once, not once per call."}
}
