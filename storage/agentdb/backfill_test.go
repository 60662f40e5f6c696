package agentdb

import (
	"context"
	"fmt"
	"testing"
)

func TestKnownDeliveryIDs(t *testing.T) {
	db := openAgentDB(t)
	ctx := context.Background()
	var caps []*Capture
	for i := 0; i < 700; i += 2 { // every even delivery id is captured
		caps = append(caps, callCapture(i, "call-1", "call.started", ""))
	}
	if _, err := db.WriteCaptures(ctx, caps, nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 1200 { // more than one chunk of parameters
		ids = append(ids, fmt.Sprintf("d%d", i))
	}
	known, err := db.KnownDeliveryIDs(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(known) != 350 {
		t.Fatalf("%d known, want 350", len(known))
	}
	for i := range 1200 {
		if want := i < 700 && i%2 == 0; known[fmt.Sprintf("d%d", i)] != want {
			t.Fatalf("d%d: known %v, want %v", i, !want, want)
		}
	}
	if k, err := db.KnownDeliveryIDs(ctx, nil); err != nil || len(k) != 0 {
		t.Fatalf("no ids: %v %v", k, err)
	}
}
