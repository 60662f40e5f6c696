package agentdb

import (
	"context"
	"fmt"
	"reflect"
	"testing"
)

// searchStore holds more captures than searchCap matching a common word,
// so that each of searchCaptures' ways is taken.
func searchStore(t *testing.T) *AgentStore {
	t.Helper()
	ctx := context.Background()
	db := openAgentDB(t)
	var batch []*Capture
	for i := range searchCap + 500 {
		city := "Boston"
		if i%3 == 0 {
			city = "Denver"
		}
		c := testCapture(i, []byte(fmt.Sprintf(`{"city":%q,"lead_id":"L-%d","note":"common"}`, city, i%700)))
		if i%2 == 0 {
			c.Event = "call.started"
		}
		batch = append(batch, c)
	}
	if _, err := db.WriteCaptures(ctx, batch, nil); err != nil {
		t.Fatal(err)
	}
	return db
}

func TestSearchMatchesList(t *testing.T) {
	ctx := context.Background()
	db := searchStore(t)
	for _, f := range []CaptureFilter{
		{Text: "L-77"},
		{Text: "l-77", Event: "call.started"},
		{Text: "Denver"},
		{Text: "denver", Event: "call.ended"},
		{Text: "common"},
		{Text: "common boston", Event: "call.started"},
		{Text: "nowhere"},
		{Text: `"L-1`},
	} {
		for _, p := range []Page{{Limit: 50}, {Limit: 50, Offset: 490}, {Limit: 50, Offset: searchCap - 20}, {Limit: 10, Offset: 5000}} {
			f.Page = p
			got, gotN, err := db.Captures(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			want, wantN, err := db.listCaptures(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if gotN != wantN || !reflect.DeepEqual(ids(got), ids(want)) {
				t.Errorf("%+v: got %d %v, want %d %v", f, gotN, ids(got), wantN, ids(want))
			}
		}
	}
}

func ids(cs []*Capture) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}
