package idfilter

import (
	"fmt"
	"testing"
)

// The filter never forgets an id it was given, and at a million ids it
// answers "maybe" for few it was not (about 1 in 500 with its four
// hashes; a filter of one hash would answer it for 1 in 17).
func TestIDFilterFalsePositives(t *testing.T) {
	f := New()
	const added, others = 1_000_000, 100_000
	for i := range added {
		f.Add(fmt.Sprintf("d-%d", i))
	}
	for i := range added {
		if id := fmt.Sprintf("d-%d", i); !f.MayHave(id) {
			t.Fatalf("%s was added and is not in the filter", id)
		}
	}
	maybe := 0
	for i := range others {
		if f.MayHave(fmt.Sprintf("other-%d", i)) {
			maybe++
		}
	}
	if maybe > others/100 {
		t.Errorf("%d of %d ids never added may be there, want under 1%%", maybe, others)
	}
}
