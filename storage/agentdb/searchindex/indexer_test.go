package searchindex

import (
	"context"
	"errors"
	"testing"
	"time"
)

// pacer is an Indexer with no file: its pace alone, as WaitRoom and
// setPosition keep it.
func pacer(upto, last, bound, lead, credit int64) *Indexer {
	return &Indexer{wake: make(chan struct{}, 1), moved: make(chan struct{}),
		upto: upto, last: last, bound: bound, lead: lead, credit: credit}
}

// A writer within the backlog's bound never waits, whatever credit it has
// left; past it, with its credit spent, it waits for the indexer.
func TestSearchBoundAndCredit(t *testing.T) {
	ctx := context.Background()
	// Within (a backlog of 0, a bound of 0), no credit: it saves at once.
	ix := pacer(10, 10, 0, DefaultLead, 0)
	short, cancel := context.WithTimeout(ctx, 5*time.Second) // bounds a hang
	defer cancel()
	if err := ix.WaitRoom(short, 1); err != nil {
		t.Fatalf("a write within the bound: %v", err)
	}
	// Past the bound, the index held: the lead, then nothing more.
	ix = pacer(10, 12, 0, DefaultLead, 5)
	if err := ix.WaitRoom(ctx, 5); err != nil {
		t.Fatal(err)
	}
	spent, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := ix.WaitRoom(spent, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a write past the bound with no credit left, the index held: %v, want it to wait", err)
	}
}

// Each capture the indexer indexes is one more the writer may save past
// the bound, up to the lead; a position that goes back gives nothing.
func TestIndexingGivesCredit(t *testing.T) {
	ix := pacer(100, 0, DefaultBacklogMax, DefaultLead, 0)
	ix.setPosition(150, 200)
	if ix.credit != 50 {
		t.Fatalf("50 indexed: credit %d, want 50", ix.credit)
	}
	ix.setPosition(140, 200)
	if ix.credit != 50 || ix.upto != 140 {
		t.Fatalf("a position back by 10: credit %d, upto %d; want 50, 140", ix.credit, ix.upto)
	}
	ix.setPosition(140+2*DefaultLead, 200+2*DefaultLead)
	if ix.credit != DefaultLead {
		t.Fatalf("%d indexed: credit %d, want the lead %d", 2*DefaultLead, ix.credit, DefaultLead)
	}
}
