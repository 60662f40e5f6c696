package main

import (
	"strings"
	"testing"
)

// The startup line about what the relay held says what the relay holds,
// never that all of it will be delivered: after a relay restart it can
// send requests this agent already saved, which the agent does not forward
// again (an agent printed "Delivering 195 requests" and delivered none).
func TestAwayLineSaysOnlyWhatWillBeDelivered(t *testing.T) {
	if got := awayLine(0); got != "" {
		t.Errorf("nothing held: %q, want no line", got)
	}
	got := awayLine(195)
	for _, want := range []string{"195", "held", "not already saved here"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "Delivering 195") {
		t.Errorf("%q promises every held request to the handler", got)
	}
}
