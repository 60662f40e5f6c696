package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/cluster"
	"github.com/calltap/calltap/relay/cluster/natstest"
	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/relaystate"
)

// One call remembered at once by many requests on two nodes, each
// naming a seat of its own, belongs to one seat, which every one of them
// is told and both nodes read back.
func TestRememberCallRacedAgreesOnOneSeat(t *testing.T) {
	nats := natstest.Start(t, 3)
	nodes := []*cluster.Cluster{openStore(t, nats, "a"), openStore(t, nats, "b")}
	ctx := context.Background()
	for call := range 5 {
		callID := fmt.Sprintf("v3:race-%d", call)
		const racers = 16
		seats := make([]string, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		now := time.Now()
		for i := range racers {
			wg.Go(func() {
				<-start
				rec := relaystate.CallRecord{TunnelID: testTunnel, CallID: callID, Seat: fmt.Sprintf("%s-%016x", testTunnel, i), First: now, Last: now}
				seats[i], errs[i] = nodes[i%2].RememberCall(ctx, rec)
			})
		}
		close(start)
		wg.Wait()
		for i := range racers {
			if errs[i] != nil {
				t.Fatalf("call %s, racer %d: %v", callID, i, errs[i])
			}
			if seats[i] != seats[0] {
				t.Fatalf("call %s: the racers were told seats %v, want one", callID, seats)
			}
		}
		for _, c := range nodes {
			if got, err := c.CallSeat(ctx, testTunnel, callID); err != nil || got != seats[0] {
				t.Errorf("call %s: a node reads seat %q (%v), want %q", callID, got, err, seats[0])
			}
		}
	}
}

// A known call keeps its seat; a later event moves its Last (and so its
// expiry) when it is a minute or more after the entry's, and is not
// written otherwise. The entry's key does not hold the call id, which
// its sender chose. The bucket forgets calls after Options.CallMemory.
func TestRememberCallKeepsSeatTakesLast(t *testing.T) {
	nats := natstest.Start(t, 3)
	o := storeOptions(t, nats, "a")
	o.CallMemory = 3 * time.Hour
	c, err := cluster.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	const callID = "v3:a.b>*"
	first := time.Now().UTC().Truncate(time.Microsecond)
	remember := func(seat string, last time.Time) {
		t.Helper()
		got, err := c.RememberCall(ctx, relaystate.CallRecord{TunnelID: testTunnel, CallID: callID, Seat: seat, First: last, Last: last})
		if err != nil || got != seatAlice {
			t.Fatalf("remember the call for %s: seat %q (%v), want the first event's, %s", seat, got, err, seatAlice)
		}
	}
	remember(seatAlice, first)
	kv := testBucket(t, nats, "calltap_calls")
	entry := func() (relaystate.CallRecord, uint64) {
		t.Helper()
		keys, err := kv.Keys(ctx)
		if err != nil || len(keys) != 1 {
			t.Fatalf("the bucket's keys: %v (%v), want one", keys, err)
		}
		if strings.Contains(keys[0], "a.b") || !strings.HasPrefix(keys[0], testTunnel+".") {
			t.Fatalf("key %q: want the tunnel id and a hash of the call id", keys[0])
		}
		e, err := kv.Get(ctx, keys[0])
		if err != nil {
			t.Fatal(err)
		}
		var rec relaystate.CallRecord
		json.Unmarshal(e.Value(), &rec)
		return rec, e.Revision()
	}
	_, rev := entry()
	remember(seatBob, first.Add(30*time.Second))
	if rec, r := entry(); r != rev || !rec.Last.Equal(first) {
		t.Errorf("an event 30 s later rewrote the entry (revision %d, was %d; last %v)", r, rev, rec.Last)
	}
	later := first.Add(2 * time.Minute)
	remember(seatBob, later)
	if rec, _ := entry(); !rec.Last.Equal(later) || !rec.First.Equal(first) || rec.Seat != seatAlice || rec.CallID != callID {
		t.Errorf("after an event 2 min later the entry reads %+v, want first %v, last %v, seat %s", rec, first, later, seatAlice)
	}
	if n, err := c.CallsSince(ctx, first); err != nil || n[seatAlice] != 1 || len(n) != 1 {
		t.Errorf("calls since the first event: %v (%v), want one of %s", n, err, seatAlice)
	}
	if n, err := c.CallsSince(ctx, first.Add(time.Second)); err != nil || len(n) != 0 {
		t.Errorf("calls since after the first event: %v (%v), want none", n, err)
	}
	if _, err := c.CallSeat(ctx, testTunnel, "v3:other"); !errors.Is(err, relaystate.ErrNotFound) {
		t.Errorf("the seat of an unknown call: %v, want ErrNotFound", err)
	}
	st, err := kv.Status(ctx)
	if err != nil || st.TTL() != 3*time.Hour {
		t.Errorf("the bucket keeps calls %v (%v), want Options.CallMemory, 3h", st.TTL(), err)
	}
}

// Seats and calls are in NATS's stores: they outlive every NATS server's
// restart, and a relay node's.
func TestClaimsSurviveRestarts(t *testing.T) {
	nats := natstest.Start(t, 3)
	ctx := context.Background()
	a, err := cluster.Open(ctx, storeOptions(t, nats, "a"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := a.SaveClaimant(ctx, &relaystate.Claimant{TunnelID: testTunnel, Seat: seatAlice, Claims: []string{"call.variables.developer=alice"}, CreatedAt: now, SeenAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.RememberCall(ctx, relaystate.CallRecord{TunnelID: testTunnel, CallID: "v3:kept", Seat: seatAlice, First: now, Last: now}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	nats.Shutdown()
	for i := range 3 {
		nats.Restart(i)
	}
	nats.WaitReady()
	b := openStore(t, nats, "b")
	if got := claimantIn(t, b, seatAlice); got == nil || !got.CreatedAt.Equal(now) {
		t.Errorf("after the restarts the seat reads %+v, want the one registered", got)
	}
	var seat string
	polltest.Until(t, 30*time.Second, func() bool {
		var err error
		seat, err = b.CallSeat(ctx, testTunnel, "v3:kept")
		return err == nil
	}, "the call's seat is not readable after the restarts")
	if seat != seatAlice {
		t.Errorf("after the restarts the call's seat is %q, want %q", seat, seatAlice)
	}
}
