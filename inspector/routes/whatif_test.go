package routes

import (
	"reflect"
	"testing"
)

func TestTally(t *testing.T) {
	tb := mustParse(t, goodFile, WithCallValues(NewMemory()))
	ty := NewTally(tb)
	for _, c := range []struct {
		body []byte
		took string
	}{
		{event("call.started", "c1", `,"variables":{"developer":"alice"}`), DefaultName},
		{event("call.connected", "c1", ``), DefaultName}, // alice, before quiet in the file: the call stays with alice
		{event("call.ended", "c1", ``), DefaultName},
		{event("call.started", "c2", ``), DefaultName},
		{event("call.ended", "c2", ``), "media"}, // a recorded route that the file would change
		{[]byte(`{"event":"call.connected"}`), DefaultName},
	} {
		ty.Add(tb.Match(Request{Body: c.body}), c.took)
	}
	got := ty.Report()
	want := Report{
		Captures:        6,
		Routes:          map[string]int{"alice": 3, "media": 0, "signed": 0, "quiet": 1, "bob": 0, DefaultName: 2},
		Order:           []string{"alice", "media", "signed", "quiet", "bob", DefaultName},
		ChangedCaptures: 5,
		ChangedCalls: []CallChange{
			{CallID: "c1", Took: []string{DefaultName}, Would: []string{"alice"}, Captures: 3},
			{CallID: "c2", Took: []string{DefaultName, "media"}, Would: []string{DefaultName}, Captures: 1},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}
